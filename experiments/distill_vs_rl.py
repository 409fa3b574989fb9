"""Issue 28 item 3: on-policy distillation from a small RL-trained teacher against RL alone, same warm start.

Teacher: the quickstart (embedded default: SFT warm start, then GDPO on the answer and format rewards) trained
for `--teacher-steps` RL steps with seed 0. Students, per seed: the quickstart's warm start of that seed, then
`--steps` steps of GRPO on the sparse answer reward alone (`tags_only`: an untagged answer scores 0, and the
warm start tags one answer in four), either

  rl       RL alone, or
  distill  the same with `algorithm.distill: {teacher, coef: 1, mode: reward}` (the teacher's per-token reverse
           KL added to the advantages: tinker-cookbook's rule),

evaluated greedily on the 64 held-out questions after every step. Reported per method: held-out accuracy by
step (mean and spread over seeds), and the first step at which it reaches `--target`.

Run: python -m experiments.distill_vs_rl [--seeds 0 1 2] [--steps 12] [--teacher-steps 20] [--target 0.9]
     [--out docs/experiments/distill_vs_rl]   (writes OUT.md, OUT.png, OUT.json)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from experiments import common

METHODS = ("rl", "distill")
ANSWER_ONLY = "rewards=[{name: answer, type: math_answer, weight: 1.0, params: {tags_only: true}}]"


def teacher(run_dir: Path, steps: int) -> Path:
    """The quickstart trained for `steps` RL steps (seed 0): the teacher's run directory."""
    common.train_quickstart(run_dir, [f"train.steps={steps}", f"train.eval_every={steps}"])
    return run_dir


def student(method: str, seed: int, steps: int, init: Path, teacher_dir: Path, run_dir: Path) -> np.ndarray:
    """Held-out accuracy after steps 0..`steps` of one student run from the warm start `init`."""
    sets = [f"train.seed={seed}", f"train.steps={steps}", "train.eval_every=1", "algorithm.name=grpo",
            ANSWER_ONLY, "model.preset=null", f"model.checkpoint={init}", "model.overrides={}",
            "sft_warmup.steps=0"]
    if method == "distill":
        sets += [f"algorithm.distill.teacher={teacher_dir}"]
    rows = common.train_quickstart(run_dir, sets)
    acc = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    return np.asarray([acc[s] for s in range(steps + 1)])


def first_reaching(curve: np.ndarray, target: float) -> float:
    """The first step whose held-out accuracy is >= target (inf when none)."""
    hits = np.flatnonzero(curve >= target)
    return float(hits[0]) if hits.size else float("inf")


def report(curves: dict[str, np.ndarray], target: float, out: Path) -> str:
    """Markdown table and curves plot of the [S, T+1] accuracy arrays per method."""
    steps = next(iter(curves.values())).shape[1] - 1
    rows = []
    for m, c in curves.items():
        s = common.seed_stats(c[:, -1])
        reach = [first_reaching(row, target) for row in c]
        rows.append([m, f"{c[:, 0].mean():.3f}", s.cell(),
                     ", ".join("never" if np.isinf(r) else str(int(r)) for r in reach)])
    table = common.markdown_table(["method", "acc. step 0", f"acc. step {steps} (mean ± std [min, max])",
                                   f"first step with acc. >= {target} (per seed)"], rows)
    common.plot_curves(out.with_suffix(".png"), {"held-out accuracy (64 questions, greedy)": curves},
                       xlabel="RL step", x=np.arange(steps + 1))
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--teacher-steps", type=int, default=20)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--out", type=Path, default=Path("docs/experiments/distill_vs_rl"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        teacher_dir = teacher(root / "teacher", args.teacher_steps)
        curves = {m: [] for m in METHODS}
        for seed in args.seeds:
            init = common.quickstart_warm_start(seed, root / f"warm{seed}")
            for m in METHODS:
                curves[m].append(student(m, seed, args.steps, init, teacher_dir, root / f"{m}{seed}"))
                print(m, seed, np.round(curves[m][-1], 3).tolist(), flush=True)
    arrays = {m: np.stack(v) for m, v in curves.items()}
    table = report(arrays, args.target, args.out)
    common.write_text(args.out.with_suffix(".md"), f"# On-policy distillation vs RL alone\n\n{__doc__}\n{table}")
    common.write_text(args.out.with_suffix(".json"), json.dumps({m: a.tolist() for m, a in arrays.items()}))
    print(table)


if __name__ == "__main__":
    main()
