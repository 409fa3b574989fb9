"""PNG plots of training curves from one or more run directories (several runs overlaid, one line per run).

Panels: reward, held-out accuracy, KL, entropy, response length, and the per-reward means. A panel no run has
data for is skipped. matplotlib runs on the Agg backend (no display needed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from jaxrl.errors import UserError
from jaxrl.metrics import METRICS_FILE, read_metrics

# file stem -> (title, metric keys tried in order; the first one a run has is drawn)
PANELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "reward": ("mean reward", ("reward/mean",)),
    "accuracy": ("held-out accuracy", ("eval/accuracy",)),
    "kl": ("KL to reference", ("kl",)),
    "entropy": ("entropy", ("entropy",)),
    "response_length": ("response length (tokens)", ("response_length/mean",)),
}


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    names = [p.name for p in run_dirs]
    return names if len(set(names)) == len(names) else [str(p) for p in run_dirs]


def plot_runs(run_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> list[Path]:
    """Writes one PNG per panel with data into `out_dir`; returns the written paths.

    Raises:
      UserError: a run directory without metrics.jsonl.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [Path(p) for p in run_dirs]
    for run in runs:
        if not (run / METRICS_FILE).is_file():
            raise UserError(f"{run}: no {METRICS_FILE} (is it a jaxrl run directory?)")
    data = {label: read_metrics(run) for label, run in zip(_labels(runs), runs)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    panels = dict(PANELS)
    per_reward = sorted(
        {
            k
            for rows in data.values()
            for r in rows
            for k in r
            if k.startswith("reward/") and k.endswith("/mean") and k != "reward/mean"
        }
    )
    for key in per_reward:
        panels["reward_" + key.split("/")[1]] = (f"reward {key.split('/')[1]}", (key,))
    for stem, (title, keys) in panels.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = 0
        for label, rows in data.items():
            key = next((k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)), None)
            if key is None:
                continue
            steps, values = _series(rows, key)
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
            drawn += 1
        if drawn:
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / f"{stem}.png"
            fig.savefig(path, dpi=100)
            written.append(path)
        plt.close(fig)
    return written
