"""PNG plots of training curves from one or more run directories (several runs overlaid, one line per run).

Panels: reward, held-out accuracy, KL, entropy, response length, the per-reward means, and `step_time.png`: each
run's step time stacked by stage (`time/*`, `jaxrl.runtime.step_time`; an asynchronous run's collection as the part the
trainer waited for), one row of the figure per run. A panel no run
has data for is skipped. A metric a run did not measure is not drawn for it, even where an older run logged a
placeholder: KL when the run's `config.yaml` has the KL coefficient at 0 (earlier versions logged `kl: 0.0`
then); null values (NaN: undefined) are gaps. matplotlib runs on the Agg backend (no display needed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import yaml

from jaxrl.errors import UserError
from jaxrl.runtime.metrics import METRICS_FILE, read_metrics

# file stem -> (title, metric keys tried in order; the first one a run has is drawn)
PANELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "reward": ("mean reward", ("reward/mean",)),
    "accuracy": ("held-out accuracy", ("eval/accuracy",)),
    "kl": ("KL to reference", ("kl",)),
    "entropy": ("entropy", ("entropy",)),
    "response_length": ("response length (tokens)", ("response_length/mean",)),
}


# stages of `step_time.png`, bottom to top (`time/<stage>`; `jaxrl.runtime.step_time`, `jaxrl.rl.loop`)
BREAKDOWN = ("generation", "reward", "env", "old_logprobs", "ref_logprobs", "teacher_logprobs", "values",
             "update", "update_critic", "weight_sync", "eval", "checkpoint", "other")
# an asynchronous run (`train.async`) collects while it updates: its bars stack the collection time the trainer
# waited for (`time/exposed_generation`) in place of the collector's own stages
COLLECTION = ("generation", "reward", "env")


def _stages(rows: list[dict]) -> list[str]:
    """The stages a run's bars stack, bottom to top."""
    stages = [s for s in BREAKDOWN if any(r.get(f"time/{s}") for r in rows)]
    if any("time/exposed_generation" in r for r in rows):
        stages = ["exposed_generation"] + [s for s in stages if s not in COLLECTION]
    return stages


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def unmeasured(run_dir: Path) -> set[str]:
    """Metric keys RUN_DIR's `config.yaml` says were not measured: the KL ones when the KL coefficient is 0
    (`algorithm.kl_beta`, or `algorithm.kl.beta` in the nested layout); empty without a readable config."""
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return set()
    algo = cfg.get("algorithm") if isinstance(cfg, dict) else None
    if not isinstance(algo, dict):
        return set()
    kl = algo.get("kl")
    beta = kl.get("beta") if isinstance(kl, dict) else algo.get("kl_beta")
    return {"kl", "kl/loss"} if isinstance(beta, (int, float)) and beta == 0 else set()


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
    data = {}
    for label, run in zip(_labels(runs), runs):
        skip = unmeasured(run)
        data[label] = [{k: v for k, v in row.items() if k not in skip} for row in read_metrics(run)]
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
    path = _plot_breakdown(plt, data, out / "step_time.png")
    return written + ([path] if path else [])


def _plot_breakdown(plt, data: dict[str, list[dict]], path: Path) -> Path | None:
    """Stacked seconds per stage of every step (and `time/step` as a line), one subplot per run with them."""
    runs = {label: [r for r in rows if r.get("step", 0) > 0 and isinstance(r.get("time/step"), (int, float))]
            for label, rows in data.items()}
    runs = {label: rows for label, rows in runs.items() if rows}
    if not runs:
        return None
    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 3.2 * len(runs)), squeeze=False)
    for ax, (label, rows) in zip(axes[:, 0], runs.items()):
        steps = [r["step"] for r in rows]
        stages = _stages(rows)
        bottom = [0.0] * len(rows)
        for stage in stages:  # stacked bars, one per step
            seconds = [float(r.get(f"time/{stage}") or 0.0) for r in rows]
            ax.bar(steps, seconds, width=0.9, bottom=bottom, label=stage, linewidth=0)
            bottom = [b + s for b, s in zip(bottom, seconds)]
        totals = [r["time/step"] for r in rows]
        ax.plot(steps, totals, "k_", markersize=12, label="time/step")
        ax.xaxis.get_major_locator().set_params(integer=True)
        cap = 2 * sorted(totals)[int(0.9 * (len(totals) - 1))]
        if len(totals) > 3 and max(totals) > cap:  # compiling steps off the scale, labelled, so the rest shows
            ax.set_ylim(0, cap)
            for step, total in zip(steps, totals):
                if total > cap:
                    ax.annotate(f"{total:.3g} s", (step, cap), ha="left", va="top", fontsize=7)
        ax.set_title(f"step time by stage: {label}")
        ax.set_xlabel("step")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
