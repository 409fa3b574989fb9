"""Test-wide settings, fixed once: 8 fake CPU devices and offline Hugging Face libraries; `train_cli`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._xla import xla_flags

os.environ.setdefault("XLA_FLAGS", xla_flags(8))  # 8 fake devices, compiled at -O1 (tests/_xla.py)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

from absl import flags  # noqa: E402

# grain's multiprocessing reads absl flags; mark them parsed so pytest does not trip over it.
flags.FLAGS.mark_as_parsed()

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """`tests/suite.py` runs the suite in two phases: `JAXRL_TEST_PHASE=parallel` keeps the tests not marked
    `serial` (two xdist workers), `serial` keeps the marked ones (alone on the machine). Unset: every test."""
    phase = os.environ.get("JAXRL_TEST_PHASE")
    if phase not in ("parallel", "serial"):
        return
    # Longest file first (LPT), so that the two workers end together: `tests/durations.json` holds each file's
    # seconds from a measured run (`python tests/suite.py --record-durations` rewrites it); a file it does not
    # know yet counts as 30 s. A stable sort: every worker computes the same order; a file keeps its own.
    seconds = json.loads((REPO / "tests" / "durations.json").read_text())
    items.sort(key=lambda item: -seconds.get(item.path.relative_to(REPO).as_posix(), 30.0))
    keep, drop = [], []
    for item in items:
        serial = item.get_closest_marker("serial") is not None
        (keep if serial == (phase == "serial") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def train_cli():
    """`train_cli(config, run_dir, overrides, timeout)`: runs `jaxrl train CONFIG --run-dir RUN_DIR --set k=v
    ...` from the repository root in a subprocess on one CPU device (no fake devices, no compile cache),
    offline; asserts exit 0 (showing the log's tail otherwise) and returns the run's metrics rows."""
    from jaxrl.runtime.metrics import read_metrics

    def run(config: str, run_dir: Path, overrides: dict, timeout: float) -> list[dict]:
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_CACHE")}
        env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
        argv = [sys.executable, "-m", "jaxrl.cli", "train", config, "--run-dir", str(run_dir), *sets]
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        return read_metrics(run_dir)

    return run


@pytest.fixture
def eval_cli():
    """`eval_cli(run_dir, *args)`: runs `jaxrl eval --checkpoint RUN_DIR ARGS` as `train_cli` runs `jaxrl
    train`; returns the printed JSON object."""
    def run(run_dir: Path, *args: str, timeout: float = 600) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_CACHE")}
        env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        argv = [sys.executable, "-m", "jaxrl.cli", "eval", "--checkpoint", str(run_dir), *args]
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        return json.loads(proc.stdout)

    return run
