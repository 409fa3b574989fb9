"""Issue 28 item 1: PPO with a learned critic and GAE against the quickstart's GDPO, same warm start.

The quickstart (embedded default) task and rewards (a strict tagged-answer reward and a format reward); one SFT
warm start (`--warm-start`, a run directory; default: the quickstart's warm start of seed 0, made here), then per
RL seed (`train.seed`: sampling and mini-batch order) `--steps` steps of

  gdpo   the quickstart's algorithm (each reward normalised within its group of 8), or
  ppo    `algorithm.name: ppo` with verl's defaults (γ = λ = 1, value clip 0.5, whitened GAE advantages), the
         critic started from the warm-started policy with a fresh value head, trained at the policy's learning
         rate,

evaluated greedily on the 64 held-out questions every `--eval-every` steps. Reported per method: held-out
accuracy (mean and spread over seeds) and the first evaluated step at which it reaches `--target`.

Run: python -m experiments.ppo_vs_grpo [--seeds 0 1 2] [--steps 20] [--eval-every 1] [--target 0.8]
     [--warm-start RUN] [--out docs/experiments/ppo_vs_grpo]   (writes OUT.md, OUT.png, OUT.json)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from experiments import common
from experiments.distill_vs_rl import report

METHODS = ("gdpo", "ppo")


def run(method: str, seed: int, steps: int, every: int, init: Path, run_dir: Path) -> np.ndarray:
    """Held-out accuracy at steps 0, every, 2·every, ..., steps of one run from the warm start `init`."""
    rows = common.train_quickstart(run_dir, [f"train.seed={seed}", f"train.steps={steps}",
                                             f"train.eval_every={every}", f"algorithm.name={method}",
                                             "model.preset=null", f"model.checkpoint={init}", "model.overrides={}",
                                             "sft_warmup.steps=0"])
    acc = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    return np.asarray([acc[s] for s in range(0, steps + 1, every)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=1)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--warm-start", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("docs/experiments/ppo_vs_grpo"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        init = args.warm_start or common.quickstart_warm_start(0, root / "warm")
        curves = {m: [] for m in METHODS}
        for seed in args.seeds:
            for m in METHODS:
                curves[m].append(run(m, seed, args.steps, args.eval_every, init, root / f"{m}{seed}"))
                print(m, seed, np.round(curves[m][-1], 3).tolist(), flush=True)
    arrays = {m: np.stack(v) for m, v in curves.items()}
    table = report(arrays, args.target, args.out)
    note = "" if args.eval_every == 1 else (f"Evaluated every {args.eval_every} steps: the table's and the plot's "
                                            f"step k is RL step {args.eval_every}·k.\n\n")
    common.write_text(args.out.with_suffix(".md"), f"# PPO with a critic vs GDPO\n\n{__doc__}\n{note}{table}")
    common.write_text(args.out.with_suffix(".json"), json.dumps({m: a.tolist() for m, a in arrays.items()}))
    print(table)


if __name__ == "__main__":
    main()
