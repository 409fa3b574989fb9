"""The curves of a tiny agentic run, from its metrics.jsonl (default: RUN_DIR/agentic_<panels>.png).

    python docs/agentic_curve.py RUN_DIR [--baseline 0.031] [--out docs/agentic_search_tiny.png]
    python docs/agentic_curve.py RUN_DIR --panels march --out docs/march_tiny.png
    python docs/agentic_curve.py RUN_DIR --panels ssp --baseline 0.109 --out docs/ssp_tiny.png
    python docs/agentic_curve.py runs/search_smollm2_hard --baseline 0 --held-out 32 --title "..." \
        --out docs/search_smollm2_hard.png

`--panels search` (configs/search_tiny.yaml): left, held-out greedy accuracy (`eval/accuracy`, every
`train.eval_every` GRPO steps) against the no-search baseline (a dashed line: the guess demonstrations'
accuracy on the held-out questions); right, per GRPO step, the training reward (exact match of sampled
episodes) and the searches per training episode (`episode/tool_calls`).
`--panels march` (configs/march_tiny.yaml, docs/multi_agent.md): left, the held-out Solver's accuracy
(greedy, and over 4 samples at temperature 1: `train.eval_samples: 4`) and greedy hallucination rate; right,
per GRPO step, the sampled chains' hallucination rate (refuted claims), the Solver's exact-answer rate, the
Checker's accuracy and the checked claims per chain.
`--panels ssp` (configs/ssp_tiny.yaml): left, the Solver's held-out greedy accuracy against the no-search
baseline; right, per step, the curriculum: proposed-question validity (`ssp/valid_frac`) and the Solver's
success on valid problems (`ssp/solver_success`, temperature 1).
The default output lies in the run directory, so a plain call never overwrites the tracked images in docs/;
pass `--out docs/...png` to update one of them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxrl.runtime.metrics import read_metrics  # noqa: E402


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that have `key`."""
    pairs = [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


PANELS = {
    "search": dict(
        left=[("eval/accuracy", "held-out greedy accuracy")], baseline="no-search baseline",
        left_title="held-out questions (64), after the SFT warm start", left_legend="center right",
        right=[("reward/mean", "training reward"), ("episode/tool_calls", "searches per episode")],
        right_title="training episodes", right_ylim=(0, None), right_legend="lower right",
        title="configs/search_tiny.yaml: 4-layer character model, SFT warm start then GRPO"),
    "march": dict(
        left=[("eval/accuracy", "Solver accuracy, greedy"), ("eval/avg@4", "Solver accuracy, avg@4"),
              ("eval/reward/hallucination/mean", "hallucination rate, greedy")],
        baseline=None, left_title="held-out questions (64)", left_legend="center right",
        right=[("march/hallucination_rate", "hallucination rate"),
               ("role/solver/correct/mean", "Solver exact answer"),
               ("march/checker_gold_frac", "Checker accuracy"), ("march/claims/mean", "claims per chain")],
        right_title="training chains (temperature 1)", right_ylim=(0, 1), right_legend="center right",
        title="configs/march_tiny.yaml: 4-layer character model, SFT warm start then GRPO on the Solver"),
    "ssp": dict(
        left=[("eval/accuracy", "Solver, held-out greedy accuracy"),
              ("eval/avg@4", "Solver, held-out sampled accuracy (avg@4)")], baseline="no-search baseline",
        left_title="held-out questions (64), after the SFT warm start", left_legend="lower right",
        right=[("ssp/valid_frac", "proposed-question validity"),
               ("ssp/solver_success", "Solver success on valid problems")],
        right_title="curriculum (training episodes)", right_ylim=(0, 1.05), right_legend="lower right",
        title="configs/ssp_tiny.yaml: 4-layer character model, SFT warm start then SSP (GRPO)"),
}


def plot(rows: list[dict], baseline: float, out: Path, panels: str = "search", title: str | None = None,
         held_out: int = 64) -> None:
    p = PANELS[panels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    for key, label in p["left"]:
        left.plot(*series(rows, key), marker="o", label=label)
    if p["baseline"]:
        left.axhline(baseline, color="grey", linestyle="--", label=p["baseline"])
    left.set(xlabel="GRPO step", ylim=(0, 1), title=p["left_title"].replace("(64)", f"({held_out})"))
    left.legend(loc=p["left_legend"], fontsize=8)
    for key, label in p["right"]:
        right.plot(*series(rows, key), label=label)
    right.set(xlabel="GRPO step", ylim=p["right_ylim"], title=p["right_title"])
    right.legend(loc=p["right_legend"], fontsize=8)
    fig.suptitle(title or p["title"], fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--baseline", type=float, default=2 / 64, help="no-search held-out accuracy")
    parser.add_argument("--out", default=None, help="PNG to write (default: RUN_DIR/agentic_<panels>.png)")
    parser.add_argument("--panels", choices=sorted(PANELS), default="search", help="which run's curves")
    parser.add_argument("--title", default=None, help="the figure's title (default: the panels' tiny config)")
    parser.add_argument("--held-out", type=int, default=64, help="held-out questions evaluated (left title)")
    args = parser.parse_args(argv)
    rows = read_metrics(args.run_dir)
    if not rows:
        print(f"no metrics.jsonl in {args.run_dir}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else Path(args.run_dir) / f"agentic_{args.panels}.png"
    plot(rows, args.baseline, out, args.panels, args.title, args.held_out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
