"""Issue 27 item 8(a): asynchronous training (`train.async.max_staleness` k = 1) against synchronous (k = 0) on
the quickstart task, same warm start per seed.

Per seed: the quickstart's SFT warm start of that seed (the embedded default config), then `--steps` RL steps
of the quickstart's own algorithm and rewards with k = 0 and with k = 1 from that warm start, held-out accuracy
(64 questions, greedy) every `--eval-every` steps. Reported per k: accuracy by step (mean and spread over
seeds), the mean step time, and for k = 1 the staleness and the collection time the trainer waited for.

Run: python -m experiments.async_vs_sync [--seeds 0 1 2] [--steps 20] [--eval-every 5]
     [--out docs/experiments/async_vs_sync]   (writes OUT.md, OUT.png, OUT.json)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from experiments import common

KS = (0, 1)
def rl(k: int, seed: int, steps: int, every: int, init: Path, run_dir: Path) -> tuple[np.ndarray, dict]:
    """(held-out accuracy at steps 0, every, 2·every, ..., steps; the timing and staleness means) of one run."""
    rows = common.train_quickstart(run_dir, [
        f"train.seed={seed}", f"train.steps={steps}", f"train.eval_every={every}", f"train.async.max_staleness={k}",
        "model.preset=null", f"model.checkpoint={init}", "model.overrides={}", "sft_warmup.steps=0"])
    acc = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    later = [r for r in rows if r["step"] > 1 and "time/step" in r]  # step 1 compiles
    mean = lambda key: float(np.mean([r.get(key, 0.0) for r in later]))  # noqa: E731
    timing = {"step_s": mean("time/step"), "exposed_s": mean("time/exposed_generation"),
              "staleness_max": max(r.get("async/staleness_max", 0.0) for r in rows if "time/step" in r)}
    return np.asarray([acc[s] for s in range(0, steps + 1, every)]), timing


def report(curves: dict[int, np.ndarray], timing: dict[int, list[dict]], every: int, out: Path) -> str:
    """Markdown table and curves plot of the [S, E] accuracy arrays per k."""
    rows = []
    for k, c in curves.items():
        s = common.seed_stats(c[:, -1])
        t = timing[k]
        rows.append([k, f"{c[:, 0].mean():.3f}", s.cell(), f"{np.mean([x['step_s'] for x in t]):.3f}",
                     f"{np.mean([x['exposed_s'] for x in t]):.3f}" if k else "all of it",
                     f"{max(x['staleness_max'] for x in t):.0f}"])
    steps = (next(iter(curves.values())).shape[1] - 1) * every
    table = common.markdown_table(["k", "acc. step 0", f"acc. step {steps} (mean ± std [min, max])",
                                   "step time (s)", "waited for collection (s)", "staleness max"], rows)
    common.plot_curves(out.with_suffix(".png"),
                       {"held-out accuracy (64 questions, greedy)": {f"k = {k}": c for k, c in curves.items()}},
                       xlabel="RL step", x=np.arange(0, steps + 1, every))
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("docs/experiments/async_vs_sync"))
    args = p.parse_args()
    curves: dict[int, list] = {k: [] for k in KS}
    timing: dict[int, list] = {k: [] for k in KS}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for seed in args.seeds:
            init = common.quickstart_warm_start(seed, root / f"warm{seed}")
            for k in KS:
                curve, t = rl(k, seed, args.steps, args.eval_every, init, root / f"k{k}-{seed}")
                curves[k].append(curve)
                timing[k].append(t)
                print(k, seed, np.round(curve, 3).tolist(), t, flush=True)
    arrays = {k: np.stack(v) for k, v in curves.items()}
    table = report(arrays, timing, args.eval_every, args.out)
    common.write_text(args.out.with_suffix(".md"), f"# Asynchronous (k = 1) vs synchronous training\n\n{__doc__}\n"
                      f"{table}")
    common.write_text(args.out.with_suffix(".json"), json.dumps(
        {"accuracy": {str(k): a.tolist() for k, a in arrays.items()}, "timing": timing}))
    print(table)


if __name__ == "__main__":
    main()
