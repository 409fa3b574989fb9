"""Run-directory logging: `metrics.jsonl`, TensorBoard events, `samples.jsonl`, a tqdm bar; cross-host
reduction.

Only the primary process (process 0) writes anything. On resume from step k, lines of `metrics.jsonl` and
`samples.jsonl` with step > k (written after the last checkpoint by a killed run) are dropped and TensorBoard
purges its events from step k+1, so a resumed run's files read exactly like an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TB_DIR = "tb"


def _scalar(value: Any) -> float | int | str | None:
    if isinstance(value, (str, bool)) or value is None:
        return value
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"metric values must be scalars, got shape {value.shape}")
    item = value.item()
    if isinstance(item, float) and not math.isfinite(item):
        return None if math.isnan(item) else item
    return item


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Keeps only lines with step <= last_step (atomic rewrite)."""
    if not path.is_file():
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line).get("step", 0) <= last_step
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of RUN/metrics.jsonl (an empty list when the file does not exist)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsWriter:
    """Writes one JSON object per step (plus TensorBoard scalars and a progress bar) on the primary process.

    Args:
      run_dir: the run directory.
      resume_step: the step training restarts after (0 for a fresh run); later rows are dropped.
      total_steps: progress-bar length (None: no bar).
      tensorboard: also write TensorBoard event files under RUN/tb.
      primary: whether this process writes (default: `jax.process_index() == 0`).
      postfix_keys: metrics shown on the progress bar.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        resume_step: int = 0,
        total_steps: int | None = None,
        tensorboard: bool = True,
        primary: bool | None = None,
        postfix_keys: Sequence[str] = ("reward/mean", "loss"),
    ):
        self.run_dir = Path(run_dir)
        self.primary = jax.process_index() == 0 if primary is None else primary
        self.postfix_keys = tuple(postfix_keys)
        self._tb = self._bar = self._file = None
        if not self.primary:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (METRICS_FILE, SAMPLES_FILE):
            _truncate_jsonl(self.run_dir / name, resume_step)
        self._file = open(self.run_dir / METRICS_FILE, "a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / TB_DIR), purge_step=resume_step + 1)
        if total_steps is not None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=resume_step, unit="step", dynamic_ncols=True)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Appends `{"step": step, **metrics}` (scalars; NaN is written as null) and updates the bar."""
        if not self.primary:
            return
        row = {"step": int(step), **{k: _scalar(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, int(step))
        if self._bar is not None:
            self._bar.update(int(step) - self._bar.n)
            shown = {
                k.split("/")[0] if k.endswith("/mean") else k: row[k]
                for k in self.postfix_keys
                if isinstance(row.get(k), float)
            }
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)

    def write_samples(
        self, step: int, prompts: Sequence[str], completions: Sequence[str], rewards: Sequence[float]
    ) -> None:
        """Appends sample completions to RUN/samples.jsonl, one JSON object per completion."""
        if not self.primary:
            return
        with open(self.run_dir / SAMPLES_FILE, "a") as f:
            for p, c, r in zip(prompts, completions, rewards, strict=True):
                f.write(
                    json.dumps({"step": int(step), "prompt": p, "completion": c, "reward": _scalar(r)}) + "\n"
                )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def reduce_across_hosts(metrics: Mapping[str, float], op: str = "mean") -> dict[str, float]:
    """Mean / sum / max of host-local scalar metrics over all processes (identity with one process).

    Every process must call it with the same keys (it is a collective).
    """
    if op not in ("mean", "sum", "max"):
        raise ValueError(f"op={op!r}: allowed values are 'mean', 'sum', 'max'")
    keys = sorted(metrics)
    local_K = np.asarray([float(metrics[k]) for k in keys], np.float32)  # x64 is off in JAX
    if jax.process_count() == 1:
        return dict(zip(keys, local_K.tolist()))
    from jax.experimental import multihost_utils

    all_HK = np.asarray(multihost_utils.process_allgather(local_K))
    reduced_K = {"mean": np.mean, "sum": np.sum, "max": np.max}[op](all_HK, axis=0)
    return dict(zip(keys, reduced_K.tolist()))
