"""Claim 5, DIR vs Bradley-Terry: length bias and accuracy of a reward model, over seeds.

DIR (arXiv:2512.23461, https://arxiv.org/abs/2512.23461) adds a CLUB estimate of the mutual information
between the pair representation and a bias attribute to the Bradley-Terry loss. Task: the built-in synthetic
preference set of docs/reward_models.md ("a+b=" with a, b <= 4; the chosen answer is correct; in 80% of
training pairs it is also the verbose one; the 512 held-out pairs are balanced), configs/rm_length_bt.yaml and
configs/rm_length_dir.yaml unchanged except the number of steps, the seed (model init and batch order) and the
evaluation interval. Measured on the held-out set: pairwise accuracy and |corr(margin, chosen-is-longer)|
(`jaxrl.reward_model.evaluate_pairs`, the point-biserial correlation).
`--bias sycophancy` (or `format`) plants the second bias instead: the decorated response opens with "Yes, you
are right." (or is "- **7**"), DIR's CLUB term and the measured correlation use that attribute, and the
outputs are named dir_vs_bt_<bias>.*; everything else is the same.

Run: python -m experiments.dir_vs_bt [--seeds 0 1 2 3] [--steps 600] [--bias length|sycophancy|format]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from experiments import common

METHODS = {"BT": "configs/rm_length_bt.yaml", "DIR": "configs/rm_length_dir.yaml"}


def bias_overrides(bias: str) -> list[str]:
    """Config overrides that plant `bias` instead of length (none for length: the configs as they are)."""
    if bias == "length":
        return []
    return [f"data.params={{bias: {bias}, max_operand: 4}}", f"debias.attribute={bias}"]


def run_one(config: str, seed: int, steps: int, run_dir: Path, *, eval_every: int,
            bias: str = "length") -> dict:
    """Trains one RM; returns {"steps": [E], "accuracy": [E], "abs_corr": [E]} from its eval rows, and the
    final report."""
    from jaxrl.reward_model.config import load_rm_config
    from jaxrl.reward_model.run import train_rm

    sets = [f"train.steps={steps}", f"train.seed={seed}", f"train.eval_every={eval_every}",
            "checkpoint.every=100000", "checkpoint.async_save=false", "logging.tensorboard=false",
            "logging.progress_bar=false", "logging.every=100"] + bias_overrides(bias)
    final = train_rm(load_rm_config(config, sets), run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "eval/accuracy" in r]
    return {"steps": np.asarray([r["step"] for r in rows]),
            "accuracy": np.asarray([r["eval/accuracy"] for r in rows], np.float64),
            "abs_corr": np.abs(np.asarray([r[f"eval/{bias}_correlation"] for r in rows], np.float64)),
            "final": final}


def report(runs: dict[str, list[dict]], seeds: Sequence[int], out_dir: Path, *, seconds: float,
           steps: int, bias: str = "length") -> str:
    """Writes dir_vs_bt[_<bias>].png and .md; returns the markdown."""
    rows = []
    what = "chosen longer" if bias == "length" else f"chosen {bias}"
    stem = "dir_vs_bt" if bias == "length" else f"dir_vs_bt_{bias}"
    for name, rs in runs.items():
        acc = [r["final"]["accuracy"] for r in rs]
        corr = [abs(r["final"]["attributes"][bias]["correlation"]) for r in rs]
        per_seed = ", ".join(f"({a:.2f}, {c:.2f})" for a, c in zip(acc, corr))
        rows.append([name, common.seed_stats(acc).cell(), common.seed_stats(corr).cell(), per_seed])
    corr = {n: [abs(r["final"]["attributes"][bias]["correlation"]) for r in rs] for n, rs in runs.items()}
    lower = sum(d < b for b, d in zip(corr["BT"], corr["DIR"]))
    text = (f"Bias {bias}. Seeds {list(seeds)}, {steps} RM steps (DIR on from step 300), balanced held-out "
            f"set of 512 pairs, one CPU device; mean ± std [min, max] over seeds. DIR's |corr| was lower than "
            f"BT's in {lower} of {len(seeds)} seeds. Wall time {seconds / 60:.1f} min.\n\n"
            + common.markdown_table(["run", "accuracy", f"abs corr(margin, {what})",
                                     "per seed (accuracy, abs corr)"], rows))
    common.write_text(out_dir / f"{stem}.md", text)
    x = runs["BT"][0]["steps"]
    panels = {"held-out accuracy": {n: np.stack([r["accuracy"] for r in rs]) for n, rs in runs.items()},
              f"|corr(margin, {what})|": {n: np.stack([r["abs_corr"] for r in rs]) for n, rs in runs.items()}}
    common.plot_curves(out_dir / f"{stem}.png", panels, xlabel="RM step", x=x,
                       note="line = mean over seeds, band = min..max")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--out", type=Path, default=common.DOCS)
    p.add_argument("--bias", choices=("length", "sycophancy", "format"), default="length")
    a = p.parse_args(argv)
    timer = common.Timer()
    runs: dict[str, list[dict]] = {n: [] for n in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            for name, config in METHODS.items():
                runs[name].append(run_one(config, seed, a.steps, Path(tmp) / f"{name}{seed}",
                                          eval_every=a.eval_every, bias=a.bias))
                print(f"{name} seed {seed} done at {timer.elapsed():.0f} s", flush=True)
    print(report(runs, a.seeds, a.out, seconds=timer.elapsed(), steps=a.steps, bias=a.bias))


if __name__ == "__main__":
    main()
