"""A tiny `jaxrl train` config and helpers to run the real CLI as a subprocess (signals, locks, resume)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests._xla import xla_flags

JAXRL = str(Path(sys.executable).parent / "jaxrl")

TINY = """\
model:
  preset: tiny
  dtype: float32
  remat: none
  overrides: {hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, head_dim: 16, mlp_dim: 64}
tokenizer: {kind: builtin}
data: {source: arithmetic, prompts_per_step: 2, train_size: 64, eval_size: 4,
       params: {max_operand: 9, max_second: 3, ops: "+"}}
rollout: {group_size: 2, max_new_tokens: 8, prompt_buckets: [32], gen_buckets: [8]}
algorithm: {name: grpo}
rewards:
  - {name: answer, type: math_answer, weight: 1.0}
checkpoint: {every: 1000, keep: 2, async_save: false}
logging: {every: 1, progress_bar: false, tensorboard: false}
sft_warmup: {steps: 0}
train: {steps: 2, eval_every: 0}
"""


def env() -> dict:
    """One CPU device (not the test session's 8 fake ones), offline."""
    return {**os.environ, "XLA_FLAGS": xla_flags(), "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def write_config(tmp: Path) -> Path:
    cfg = tmp / "tiny.yaml"
    cfg.write_text(TINY)
    return cfg


def train_argv(cfg: Path, run_dir: Path, *sets: str) -> list[str]:
    argv = [JAXRL, "train", str(cfg), "--run-dir", str(run_dir)]
    for s in sets:
        argv += ["--set", s]
    return argv


def run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=timeout)


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())


def wait_for_metrics(proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> list[dict]:
    """Blocks until metrics.jsonl has a step row (the training loop is running); returns the rows."""
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if path.is_file() and path.read_text().strip():
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no metrics row before the timeout")


def steps_in(run_dir: Path) -> list[int]:
    ckpt = run_dir / "checkpoints"
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.is_dir() else []


def metric_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["step"] for r in rows if "step" in r]
