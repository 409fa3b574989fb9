"""SmolLM2-135M-Instruct with GRPO on reasoning-gym's `basic_arithmetic` (issue 32 item 4): held-out greedy
accuracy on 64 problems, several seeds, full fine-tune and LoRA, through the real CLI.

    python experiments/smollm2_reasoning.py [--seeds 0 1 2] [--methods full lora] [--steps 40]
        [--eval-every 20] [--unseen 512] [--runs DIR] [--report-only]

Each (method, seed) is one `jaxrl train configs/smollm2_basic_arithmetic.yaml` run in `--runs` (default
runs/smollm2_reasoning/<method>_s<seed>; a finished run is not repeated): `train.seed` changes the sampling
and nothing else (the data seed, so the 64 held-out problems, is the config's for every run). LoRA is r = 16,
alpha = 32 on all projections with lr 2e-4 (configs/smollm2_lora.yaml's recipe). The report (mean ± sample
std [min, max] over seeds of the accuracy at each evaluation, and the curves of the training answer reward)
goes to docs/experiments/smollm2_reasoning.{md,png,json}. With `--unseen N` (default 512) the base model and
every run's last checkpoint are also scored with `jaxrl eval` on N problems no run trained on, drawn from the
task's own distribution (the 64 held-out ones, then training records past those the runs drew): 64 problems
measure an accuracy to about ±0.05 (one standard error at 0.2), 512 to about ±0.018.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import DOCS, markdown_table, plot_curves, seed_stats, write_text  # noqa: E402
from jaxrl.config import load_config  # noqa: E402

CONFIG = "configs/smollm2_basic_arithmetic.yaml"
METHODS = {
    "full": [],  # the config's lr, 5e-6
    "full_lr2e-5": ["optimizer.lr=2.0e-5"],  # the earlier full fine-tune recipe, kept for the record
    "lora": ["model.lora={rank: 16, alpha: 32, dropout: 0.0}", "optimizer.lr=2.0e-4"],
}


def run(method: str, seed: int, steps: int, eval_every: int, run_dir: Path) -> float:
    """One training run (skipped when its metrics already reach `steps`); returns its wall seconds."""
    if _finished(_rows(run_dir), steps):
        return float("nan")
    sets = [f"train.seed={seed}", f"train.steps={steps}", f"train.eval_every={eval_every}",
            "checkpoint.every=1000", "logging.tensorboard=false", *METHODS[method]]
    argv = [sys.executable, "-m", "jaxrl.cli", "train", CONFIG, "--run-dir", str(run_dir)]
    for s in sets:
        argv += ["--set", s]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    start = time.perf_counter()
    with open(run_dir.with_suffix(".log"), "w") as log:
        subprocess.run(argv, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    return time.perf_counter() - start


def unseen_problems(path: Path, n: int, steps: int) -> Path:
    """A JSONL file of `n` problems no run trained on, from the task's own distribution: the config's held-out
    problems, then the training records past the first `steps` batches (every run draws the same batches: the
    data seed and order are the config's), in that order, each prompt once. Written once, then reused."""
    if path.is_file():
        return path
    from jaxrl.data.pipeline import make_splits, train_iterator

    d = load_config(CONFIG, []).data
    train, held_out = make_splits(d.source, train_size=d.train_size, eval_size=d.eval_size, seed=d.seed,
                                  params=d.params)
    batches = train_iterator(train, lambda r: r, batch_size=d.prompts_per_step, seed=d.seed)  # the runs' order
    first_epoch = list(itertools.islice(itertools.chain.from_iterable(batches), len(train)))
    drawn = {r["prompt"] for r in first_epoch[:steps * d.prompts_per_step]}
    out, kept = [], set()
    for r in [*held_out, *first_epoch]:
        if r["prompt"] not in drawn and r["prompt"] not in kept:
            kept.add(r["prompt"])
            out.append(r)
    if len(out) < n:
        raise SystemExit(f"--unseen {n}: only {len(out)} problems of the config's records were never trained on")
    write_text(path, "".join(json.dumps(r) + "\n" for r in out[:n]))
    return path


def evaluate(checkpoint: Path, data: Path, out: Path) -> dict:
    """`jaxrl eval` of a run's last checkpoint (or of the HF base model) on `data`, greedy; cached in `out`."""
    if not out.is_file():
        config = [] if (checkpoint / "config.yaml").is_file() else ["--config", CONFIG]  # a run: its own config
        argv = [sys.executable, "-m", "jaxrl.cli", "eval", "--checkpoint", str(checkpoint), *config,
                "--data", str(data), "--batch-size", "64", "--out", str(out)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    return json.loads(out.read_text())


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _finished(rows: list[dict], steps: int) -> bool:
    """Whether a run's metrics rows reach `steps`."""
    return bool(rows) and max(r["step"] for r in rows) >= steps


def unseen_table(runs: Path, methods, seeds, n: int) -> tuple[list[list], dict]:
    """Rows (method, seeds, accuracy, gain over the base) of the last checkpoints on the `n` unseen problems,
    from the `evaluate` results present; and the numbers per seed."""
    base_file = runs / f"base.unseen{n}.json"
    if not base_file.is_file():
        return [], {}
    base = json.loads(base_file.read_text())["eval/accuracy"]
    rows, raw = [["base model", 1, f"{base:.3f}", ""]], {"base": base}
    for method in methods:
        files = {s: runs / f"{method}_s{s}.unseen{n}.json" for s in seeds}
        acc = {s: json.loads(f.read_text())["eval/accuracy"] for s, f in files.items() if f.is_file()}
        if acc:
            gain = [a - base for a in acc.values()]
            rows.append([method, len(acc), seed_stats(list(acc.values())).cell(),
                         f"{seed_stats(gain).cell()}, {sum(g > 0 for g in gain)} of {len(gain)} seeds up"])
            raw[method] = {"seeds": sorted(acc), "accuracy": [acc[s] for s in sorted(acc)]}
    return rows, raw


def report(runs: Path, methods, seeds, steps: int, unseen: int = 0) -> str:
    table, curves, accs, raw = [], {}, {}, {}
    for method in methods:
        per_seed = {s: _rows(runs / f"{method}_s{s}") for s in seeds}
        done = {s: rows for s, rows in per_seed.items() if _finished(rows, steps)}
        if not done:
            continue
        evals = sorted({r["step"] for rows in done.values() for r in rows if "eval/accuracy" in r})
        acc_SE = np.asarray([[next(r["eval/accuracy"] for r in rows if r["step"] == e and "eval/accuracy" in r)
                              for e in evals] for rows in done.values()])
        series = {key: np.asarray([[next(r[key] for r in rows if r["step"] == t and key in r)
                                    for t in range(1, steps + 1)] for rows in done.values()])
                  for key in ("reward/answer/mean", "response_length/mean")}
        reward_ST = series["reward/answer/mean"]
        step_s = [np.median([r["time/step"] for r in rows if "time/step" in r]) for rows in done.values()]
        accs[method] = acc_SE
        curves[method] = series
        raw[method] = {"seeds": sorted(done), "eval_steps": evals, "accuracy": acc_SE.tolist(),
                       "train_answer_reward": reward_ST.tolist(),
                       "response_length": series["response_length/mean"].tolist(), "median_step_s": step_s}
        for e, column in zip(evals, acc_SE.T):
            table.append([method, e, len(done), seed_stats(column).cell()])
        gain = acc_SE[:, -1] - acc_SE[:, 0]
        table.append([method, f"gain {evals[0]} -> {evals[-1]}", len(done), seed_stats(gain).cell()])
    unseen_rows, raw_unseen = unseen_table(runs, methods, seeds, unseen) if unseen else ([], {})
    if raw_unseen:
        raw["unseen"] = dict(raw_unseen, problems=unseen)
    write_text(DOCS / "smollm2_reasoning.json", json.dumps(raw, indent=1))
    if curves:
        window = lambda v: np.stack([np.convolve(r, np.ones(5) / 5, mode="valid") for r in v])  # noqa: E731
        panels = {f"training {title} (5-step mean)": {m: window(v[key]) for m, v in curves.items()}
                  for title, key in (("answer reward", "reward/answer/mean"),
                                     ("completion tokens", "response_length/mean"))}
        accuracy = "held-out accuracy (64 problems, greedy)"
        panels[accuracy] = accs
        xs = {title: np.arange(5, steps + 1) for title in panels}
        xs[accuracy] = np.asarray(raw[next(iter(accs))]["eval_steps"])
        plot_curves(DOCS / "smollm2_reasoning.png", panels, xlabel="step (training curves: end of the 5-step window)",
                    x=xs, note="SmolLM2-135M-Instruct, GRPO, reasoning-gym basic_arithmetic; band = min..max over seeds")
    text = ("# SmolLM2-135M-Instruct on reasoning-gym basic_arithmetic (issue 32 item 4)\n\n"
            f"`python experiments/smollm2_reasoning.py` ({CONFIG}); held-out greedy accuracy on 64 problems, "
            "mean ± std [min, max] over seeds.\n\n"
            + markdown_table(["method", "eval step", "seeds", "held-out accuracy"], table)
            + (f"\nThe last checkpoint (step {steps}) of each run and the base model on {unseen} problems no run "
               "trained on (the 64 above, then training records past the ones the runs drew), greedy, "
               "`jaxrl eval`:\n\n" + markdown_table(["policy", "seeds", "accuracy", "gain over the base model"],
                                                     unseen_rows) if unseen_rows else "")
            + "\nCurves (training answer reward, completion length, held-out accuracy): smollm2_reasoning.png; every "
            "number per seed: smollm2_reasoning.json. The README's \"A real model\" section reads them.\n")
    write_text(DOCS / "smollm2_reasoning.md", text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--runs", type=Path, default=Path("runs/smollm2_reasoning"))
    parser.add_argument("--unseen", type=int, default=512,
                        help="also score the last checkpoints on this many never-trained problems (0: no)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for seed in args.seeds:  # every method of a seed before the next seed
            for method in args.methods:
                wall = run(method, seed, args.steps, args.eval_every, args.runs / f"{method}_s{seed}")
                print(f"{method} seed {seed}: {wall:.0f} s", flush=True)
                report(args.runs, args.methods, args.seeds, args.steps)
        if args.unseen:
            data = unseen_problems(args.runs / f"unseen{args.unseen}.jsonl", args.unseen, args.steps)
            evaluate(Path(load_config(CONFIG, []).model.hf_path).expanduser(), data,
                     args.runs / f"base.unseen{args.unseen}.json")
            for seed in args.seeds:
                for method in args.methods:
                    run_dir = args.runs / f"{method}_s{seed}"
                    if _finished(_rows(run_dir), args.steps):
                        evaluate(run_dir, data, args.runs / f"{method}_s{seed}.unseen{args.unseen}.json")
    print(report(args.runs, args.methods, args.seeds, args.steps, args.unseen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
