"""Plot of held-out accuracy and margin/attribute correlation over training for train-rm runs (the docs
figure).

    python -m jaxrl.reward_model.plot OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from jaxrl.runtime.metrics import read_metrics


def plot_runs(runs: dict[str, str | Path], out: str | Path, attribute: str = "length") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for label, run in runs.items():
        rows = [r for r in read_metrics(run) if "eval/accuracy" in r]
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["eval/accuracy"] for r in rows], marker="o", label=label)
        axes[1].plot(steps, [abs(r[f"eval/{attribute}_correlation"]) for r in rows], marker="o", label=label)
    axes[0].set(title="balanced held-out pairwise accuracy", xlabel="RM step", ylim=(0.3, 1.0))
    axes[1].set(title=f"|corr(score margin, {attribute} attribute)|", xlabel="RM step", ylim=(0.0, 1.05))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    return Path(out)


if __name__ == "__main__":
    plot_runs(dict(arg.split("=", 1) for arg in sys.argv[2:]), sys.argv[1])
