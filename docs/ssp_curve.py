"""The curve of configs/ssp_tiny.yaml in docs/multi_agent.md, from a run's metrics.jsonl (docs/ssp_tiny.png).

    python docs/ssp_curve.py RUN_DIR [--baseline 0.109] [--out docs/ssp_tiny.png]

Left: the Solver's held-out greedy accuracy (`eval/accuracy`, every `train.eval_every` RL steps) against the
no-search baseline (dashed). Right, per RL step: the curriculum, i.e. proposed-question validity
(`ssp/valid_frac`), the Solver's success on valid problems (`ssp/solver_success`, sampled at temperature 1)
and the Solver's searches per episode (`episode/tool_calls` of the Solver's rows when logged).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxrl.metrics import read_metrics  # noqa: E402


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that have a number under `key`."""
    pairs = [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot(rows: list[dict], baseline: float, out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    left.plot(*series(rows, "eval/accuracy"), marker="o", label="Solver, held-out greedy accuracy")
    left.axhline(baseline, color="grey", linestyle="--", label="no-search baseline")
    left.set(xlabel="RL step", ylim=(0, 1), title="held-out questions (64), after the SFT warm start")
    left.legend(loc="lower right", fontsize=8)
    right.plot(*series(rows, "ssp/valid_frac"), label="proposed-question validity")
    right.plot(*series(rows, "ssp/solver_success"), label="Solver success on valid problems")
    right.set(xlabel="RL step", ylim=(0, 1.05), title="curriculum (training episodes)")
    right.legend(loc="lower right", fontsize=8)
    fig.suptitle("configs/ssp_tiny.yaml: 4-layer character model, SFT warm start then SSP (GRPO)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--baseline", type=float, default=7 / 64, help="no-search held-out accuracy")
    parser.add_argument("--out", default=str(Path(__file__).with_name("ssp_tiny.png")))
    args = parser.parse_args(argv)
    rows = read_metrics(args.run_dir)
    if not rows:
        print(f"no metrics.jsonl in {args.run_dir}", file=sys.stderr)
        return 1
    plot(rows, args.baseline, Path(args.out))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
