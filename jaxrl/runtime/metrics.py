"""Run-directory logging: `metrics.jsonl`, `samples.jsonl`, experiment trackers (`jaxrl.runtime.trackers`:
TensorBoard, W&B, MLflow), a tqdm bar (on a terminal, `interactive`) or plain log lines every `log_every`
steps; cross-host reduction.

Only the primary process (process 0) writes anything. On resume from step k, lines of `metrics.jsonl` and
`samples.jsonl` with step > k (written after the last checkpoint by a killed run) are dropped and TensorBoard
purges its events from step k+1, so a resumed run's files read exactly like an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxrl.runtime import trackers as trackers_lib
from jaxrl.errors import CheckpointError

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TB_DIR = trackers_lib.TB_DIR


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


@contextlib.contextmanager
def _naming(path: Path):
    """A write error (a full disk) that names no file names `path` (the CLI's one line shows it)."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None


def _parsed_lines(path: Path) -> list[tuple[str, dict]]:
    """(line, row) of each JSON line; a last line cut short (a full disk, a killed writer) is dropped with a
    warning, any other line that is not JSON is a `CheckpointError` naming it."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError as e:
            if i < len(lines) - 1:
                raise CheckpointError(f"{path} line {i + 1} is not JSON ({e}); fix or move the file") from None
            log.warning("%s: dropped its last line, cut short by an interrupted write (%d characters)", path,
                        len(line))
    return out


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Keeps only lines with step <= last_step (atomic rewrite)."""
    if not path.is_file():
        return
    kept = [line for line, row in _parsed_lines(path) if row.get("step", 0) <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of RUN/metrics.jsonl (an empty list when the file does not exist)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [row for _, row in _parsed_lines(path)]


PLAIN_KEYS = ("reward/mean", "loss", "kl", "entropy", "response_length/mean", "eval/accuracy", "time/step")
log = logging.getLogger(__name__)


class MetricsWriter:
    """Writes one JSON object per step, the numeric metrics and samples to the trackers, and a progress bar or
    plain log lines.

    Only the primary process writes. With the bar on it shows the step just written and its `postfix_keys`;
    with it off, one line `step N/TOTAL: key value, ...` is logged (logger `jaxrl.runtime.metrics`, INFO) every
    `log_every` steps and for the last step.

    Args:
      run_dir: the run directory.
      resume_step: the step training restarts after (0 for a fresh run); later rows are dropped.
      total_steps: the run's length (None: unknown; then no bar is drawn).
      tensorboard: also write TensorBoard event files under RUN/tb (a `TensorBoardTracker` of its own; a
        writer built by `from_config` gets TensorBoard from `trackers` instead).
      primary: whether this process writes (default: `jax.process_index() == 0`).
      postfix_keys: metrics shown on the progress bar.
      progress_bar: draw a tqdm bar (needs `total_steps`); False logs plain lines instead.
      log_every: steps between plain log lines.
      trackers: `jaxrl.runtime.trackers.Tracker`s that get every row's numbers and the samples; closed with the
        writer.
      bar_file: stream the bar is drawn on (default stderr).
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
        progress_bar: bool = True,
        log_every: int = 1,
        trackers: Sequence[trackers_lib.Tracker] = (),
        bar_file: Any = None,
    ):
        self.run_dir = Path(run_dir)
        self.primary = jax.process_index() == 0 if primary is None else primary
        self.postfix_keys = tuple(postfix_keys)
        self.total_steps = total_steps
        self.log_every = max(1, int(log_every))
        self._bar = self._file = None
        self._trackers: list[trackers_lib.Tracker] = []
        self._logs_through_bar = contextlib.ExitStack()
        if not self.primary:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (METRICS_FILE, SAMPLES_FILE):
            _truncate_jsonl(self.run_dir / name, resume_step)
        self._trackers = list(trackers)
        if tensorboard:
            self._trackers.append(trackers_lib.TensorBoardTracker(self.run_dir / TB_DIR, resume_step))
        self._file = open(self.run_dir / METRICS_FILE, "a")
        if progress_bar and total_steps is not None:
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = tqdm(total=total_steps, initial=resume_step, unit="step", dynamic_ncols=True,
                             file=bar_file)
            # log lines (phases, warnings) print above the bar instead of through it
            self._logs_through_bar.enter_context(logging_redirect_tqdm())

    @classmethod
    def from_config(cls, run_dir, logging_cfg, *, resume_step: int = 0, total_steps: int | None = None,
                    config: Mapping[str, Any] | None = None, primary: bool | None = None,
                    **kwargs) -> "MetricsWriter":
        """A writer set up from a `LoggingConfig` (`progress_bar` on a terminal, `every`, `trackers` with
        the `wandb` / `mlflow` options); `config`, the resolved config as plain data, goes to the trackers.
        Only the primary process makes trackers."""
        primary = jax.process_index() == 0 if primary is None else primary
        trackers = trackers_lib.make_trackers(
            logging_cfg.trackers, run_dir, resume_step=resume_step, config=config, wandb=logging_cfg.wandb,
            mlflow=logging_cfg.mlflow) if primary else []
        return cls(run_dir, resume_step=resume_step, total_steps=total_steps, tensorboard=False,
                   primary=primary, progress_bar=logging_cfg.progress_bar and interactive(),
                   log_every=logging_cfg.every, trackers=trackers, **kwargs)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Appends `{"step": step, **metrics}` (scalars; NaN is written as null) and updates the bar / log."""
        if not self.primary:
            return
        row = {"step": int(step), **{k: _scalar(v) for k, v in metrics.items()}}
        with _naming(self.run_dir / METRICS_FILE):
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        numbers = {k: v for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        for tracker in self._trackers:
            tracker.log(int(step), numbers)
        if self._bar is not None:
            shown = {
                k.split("/")[0] if k.endswith("/mean") else k: row[k]
                for k in self.postfix_keys
                if isinstance(row.get(k), float)
            }
            # The postfix first, then the count, then one redraw: the bar shows this step's values.
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
            self._bar.update(int(step) - self._bar.n)
            self._bar.refresh()
        elif int(step) % self.log_every == 0 or int(step) == self.total_steps:
            log.info("%s", plain_line(row, self.total_steps))

    def write_samples(
        self, step: int, prompts: Sequence[str], completions: Sequence[str], rewards: Sequence[float]
    ) -> None:
        """Appends sample completions to RUN/samples.jsonl, one JSON object per completion, and gives them to
        the trackers as one table."""
        if not self.primary:
            return
        rows = [{"step": int(step), "prompt": p, "completion": c, "reward": _scalar(r)}
                for p, c, r in zip(prompts, completions, rewards, strict=True)]
        with _naming(self.run_dir / SAMPLES_FILE), open(self.run_dir / SAMPLES_FILE, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        for tracker in self._trackers:
            tracker.log_samples(int(step), rows)

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            with _naming(self.run_dir / METRICS_FILE):
                file.close()
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close()
        if self._bar is not None:
            self._logs_through_bar.close()
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except OSError:
            if exc is None:
                raise  # else the error that stopped the run is the one to report (a full disk: both are)


def interactive() -> bool:
    """Whether stdout and stderr are both terminals: only then is a progress bar drawn (a log file gets plain
    lines, never bar frames)."""
    return all(stream is not None and stream.isatty() for stream in (sys.stdout, sys.stderr))


def plain_line(row: Mapping[str, Any], total_steps: int | None = None) -> str:
    """`step 5/80: reward/mean 0.42, loss 0.0131, ...`: the `PLAIN_KEYS` a row has (None shows as nan)."""
    where = f"step {row['step']}" + (f"/{total_steps}" if total_steps is not None else "")
    parts = []
    for key in PLAIN_KEYS:
        if key in row:
            value = row[key]
            parts.append(f"{key} {'nan' if value is None else format(value, '.4g')}")
    return f"{where}: {', '.join(parts)}" if parts else where


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
