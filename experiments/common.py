"""Shared helpers of the experiment scripts: seed statistics, markdown tables, PNG curves, timing.

Every script reports mean and spread over seeds: the spread is the sample standard deviation (ddof=1) and the
min..max range, so a reader sees both how far apart the seeds were and whether one seed drives the mean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

DOCS = Path(__file__).resolve().parent.parent / "docs" / "experiments"


@dataclasses.dataclass(frozen=True)
class SeedStats:
    """Mean, sample std (ddof=1; 0 for one seed), min and max of one quantity over seeds."""

    mean: float
    std: float
    lo: float
    hi: float
    n: int

    def cell(self, digits: int = 3) -> str:
        """'mean ± std [min, max]' for a markdown table."""
        f = f"{{:.{digits}f}}"
        return f"{f.format(self.mean)} ± {f.format(self.std)} [{f.format(self.lo)}, {f.format(self.hi)}]"


def seed_stats(values: Sequence[float]) -> SeedStats:
    """Statistics of one value per seed (NaN-free).

    Args:
      values: [S] one float per seed.

    Returns:
      SeedStats over the S values.
    """
    v_S = np.asarray(values, np.float64).reshape(-1)
    if v_S.size == 0 or not np.all(np.isfinite(v_S)):
        raise ValueError(f"seed_stats needs finite values, got {v_S}")
    std = float(v_S.std(ddof=1)) if v_S.size > 1 else 0.0
    return SeedStats(float(v_S.mean()), std, float(v_S.min()), float(v_S.max()), int(v_S.size))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table (cells formatted with str)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_text(path: Path, text: str) -> Path:
    """Writes `text` to `path` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def plot_curves(path: Path, panels: Mapping[str, Mapping[str, np.ndarray]], *, xlabel: str,
                x: np.ndarray | Mapping[str, np.ndarray] | None = None, note: str | None = None) -> Path:
    """One subplot per panel; each series is an [S, T] array (seeds x points) drawn as its mean with a
    min..max band.

    Args:
      path: PNG to write.
      panels: title -> {series label -> [S, T] values}.
      xlabel: x-axis label.  x: [T] x values (default 1..T), or title -> [T] per panel (a panel not in it:
        1..T).  note: text under the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels.items()):
        for label, v_ST in series.items():
            v_ST = np.atleast_2d(np.asarray(v_ST, np.float64))
            x_T = x.get(title) if isinstance(x, Mapping) else x
            xs = np.arange(1, v_ST.shape[1] + 1) if x_T is None else np.asarray(x_T)
            line, = ax.plot(xs, np.nanmean(v_ST, axis=0), label=f"{label} (n={v_ST.shape[0]})")
            ax.fill_between(xs, np.nanmin(v_ST, axis=0), np.nanmax(v_ST, axis=0), color=line.get_color(),
                            alpha=0.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, va="bottom")
        fig.subplots_adjust(bottom=0.22)
    fig.tight_layout(rect=(0, 0.06 if note else 0, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def add_raw_arguments(parser) -> None:
    """`--raw DIR` (keep each finished run as DIR/<method><seed>.npz) and `--report-only` (report from them)."""
    parser.add_argument("--raw", type=Path, default=None, help="keep each finished run here as .npz")
    parser.add_argument("--report-only", action="store_true", help="report the seeds whose runs are in --raw")


def save_arrays(path: Path, run: Mapping[str, np.ndarray]) -> None:
    """One run's arrays as `path` (.npz; keys must be valid names, no "/")."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **run)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Inverse of `save_arrays`."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def stored_runs(raw: Path, seeds: Sequence[int], methods: Sequence[str], load) -> tuple[list[int], dict]:
    """(the seeds whose runs of every method are in `raw`, {method: [load(run file) per such seed]})."""
    kept = [s for s in seeds if all((Path(raw) / f"{m}{s}.npz").is_file() for m in methods)]
    return kept, {m: [load(Path(raw) / f"{m}{s}.npz") for s in kept] for m in methods}


@contextlib.contextmanager
def probing(sets: Mapping[str, list[dict]], metric: str | None = "eval/accuracy") -> Iterator[list[dict]]:
    """Within the block, every evaluation of `jaxrl.rl.loop.train` also scores each probe set greedily (the
    held-out evaluation's own wrapper); the yielded list gets one {set name: value} per evaluation, in order,
    the value being the evaluation's `metric`, or its whole result dict when `metric` is None. The trainer's
    own result is returned unchanged."""
    from jaxrl.rl import loop as rl_loop

    log: list[dict] = []
    real = rl_loop.evaluate

    def probed(collect, params, records, encoder, spec, **kw):
        out = real(collect, params, records, encoder, spec, **kw)
        scores = {name: real(collect, params, recs, encoder, spec, batch_size=kw["batch_size"])
                  for name, recs in sets.items()}
        log.append({name: r if metric is None else r[metric] for name, r in scores.items()})
        return out

    rl_loop.evaluate = probed
    try:
        yield log
    finally:
        rl_loop.evaluate = real


class Timer:
    """Wall-clock seconds since construction (`elapsed()`)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


QUIET = ["logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.async_save=false",
         "checkpoint.every=1000"]


def train_quickstart(run_dir: Path, sets: list[str]) -> list[dict]:
    """`jaxrl.rl.loop.train` of the embedded quickstart config with `sets` (quiet, checkpoints only at the
    end) in this process; returns the run's metrics rows."""
    import json

    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    train(load_config(None, QUIET + sets), run_dir)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def quickstart_warm_start(seed: int, run_dir: Path) -> Path:
    """The quickstart's SFT warm start of `seed` as a run directory (one RL step at learning rate 1e-12, below
    float32 resolution of the weights, so that `train` writes a checkpoint of the warm-started weights)."""
    train_quickstart(run_dir, [f"train.seed={seed}", "train.steps=1", "train.eval_every=0",
                               "optimizer.lr=1e-12"])
    return run_dir
