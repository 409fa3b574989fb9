"""Shared settings of the trainer tests: tiny run overrides and a subprocess launcher.

The trainer runs in subprocesses with ONE CPU device (`--xla_force_host_platform_device_count=1`) instead
of the 8 fake devices of tests/conftest.py: sharded programs compile several times slower on this 2-core
machine, and sharding correctness is covered by tests/sharding. Subprocesses share a persistent XLA
compilation cache under .cache/ (gitignored), so the same shapes compile once across the runs of a session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests._xla import suite_cache_dir, xla_flags

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# the suite's one compilation cache (the Makefile sets it), or a cache of its own when run without `make test`
CACHE = suite_cache_dir()

# Two rewards (so gdpo/gd2po apply) that vary inside a group on an untrained model.
REWARDS = ("rewards=[{name: digits, type: function, function: '_train_rewards:digit_frac'},"
           " {name: short, type: function, function: '_train_rewards:short', weight: 0.5}]")

BASE = (
    "model.preset=tiny", "data.prompts_per_step=2", "data.train_size=64", "data.eval_size=4",
    "rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.prompt_buckets=[32]",
    "rollout.logprobs_from_sampler=false", "train.steps=2", "train.eval_every=0", "sft_warmup.steps=0",
    "optimizer.lr=1e-2", "optimizer.warmup_steps=0", "checkpoint.every=1", "checkpoint.keep=5",
    "checkpoint.async_save=false", "logging.tensorboard=false", "logging.progress_bar=false",
    "logging.sample_every=1", "logging.num_samples=2", REWARDS,
)

TIMING_KEYS = ()
TIMING_PREFIX = ("time/", "throughput/")  # wall-clock keys (`jaxrl.runtime.step_time`): they differ between runs


def env(fast_compile: bool = True) -> dict[str, str]:
    """The subprocess environment: one CPU device, the shared cache, offline. `fast_compile=False` keeps XLA's
    default code generation (a "learns" run whose trajectory is documented; tests/_xla.py)."""
    e = dict(os.environ)
    e.update(XLA_FLAGS=xla_flags(1) if fast_compile else "--xla_force_host_platform_device_count=1",
             JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=str(CACHE), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
             HF_DATASETS_OFFLINE="1",
             # the helpers here and the repository (`tests._xla`) first, then the caller's path, if any
             PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), *filter(None, [e.get("PYTHONPATH")])]))
    return e


def train_cmd(run_dir: Path, *overrides: str) -> list[str]:
    args = [a for o in (*BASE, *overrides) for a in ("--set", o)]
    return [sys.executable, "-m", "jaxrl.cli", "train", *args, "--run-dir", str(run_dir)]


def run_train(run_dir: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(run_dir, *overrides), cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def metrics(run_dir: Path, *, drop_timing: bool = True) -> list[dict]:
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    if drop_timing:
        rows = [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIX) and k not in TIMING_KEYS}
                for r in rows]
    return rows


def trained_metrics(run_dir: Path, *overrides: str) -> list[dict]:
    """`jaxrl train` with these overrides, which must exit 0; its metrics (timing dropped)."""
    proc = run_train(run_dir, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return metrics(run_dir)
