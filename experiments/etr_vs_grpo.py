"""Claim 3, ETR vs GRPO: policy entropy and held-out accuracy over training.

Paper (ETR, Zhang et al., arXiv:2601.03723): elastic trust regions keep the policy's entropy from collapsing
as fast as GRPO's, with no loss of accuracy. There is no public code: `algorithm.name: etr` is jaxrl's
documented reading (../shared/spec/algorithms.md section 2): GRPO with per-sample clip bounds
  eps_i = eps * (1 + alpha * min(|A_i|, a_max)) * (1 + beta * sigma_g),
sigma_g the std of the rewards in sample i's group (`losses.etr_clip_bounds`).

Task: the quickstart's arithmetic ("What is 47 + 3?") after its mixed-format SFT warm start, with its two
rewards (answer with tags_only, weight 1; format, weight 0.5). A clip range only acts when the policy moves
between the rollout and the update, so every run makes `ppo_epochs` x `mini_batches` updates per batch (2 x 2
by default); with one on-policy update ETR and GRPO would be the same step.
Each seed warm-starts once; GRPO and ETR start from that checkpoint with the same data seed and rollout keys.

Measured: the trainer's `entropy` (mean token entropy of the policy on the batch's completions, each step),
`clip_frac`, the training reward, and the greedy held-out accuracy every `eval_every` steps.

Run: python -m experiments.etr_vs_grpo [--seeds 0 1 2] [--steps 20] [--raw DIR] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from experiments import common

METHODS = ("grpo", "etr")


def overrides(method: str, seed: int, steps: int, *, eval_every: int, alpha: float, beta: float,
              updates: int, sft_steps: int | None, small: bool) -> list[str]:
    """`--set` overrides of configs/quickstart.yaml for one run (`updates` = ppo_epochs = mini_batches)."""
    out = [f"algorithm.name={method}", f"train.steps={steps}", f"train.seed={seed}", f"data.seed={seed}",
           f"train.eval_every={eval_every}", f"algorithm.ppo_epochs={updates}",
           f"algorithm.mini_batches={updates}", "data.prompts_per_step=4", "data.eval_size=32",
           "checkpoint.every=100000", "checkpoint.async_save=false", "logging.tensorboard=false",
           "logging.progress_bar=false", "logging.sample_every=100000"]
    if method == "etr":
        out += [f"algorithm.params.alpha={alpha}", f"algorithm.params.beta={beta}"]
    if sft_steps is not None:
        out += [f"sft_warmup.steps={sft_steps}"]
    if small:  # CI: a smaller model and warm start
        out += ["model.overrides={hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4,"
                " head_dim: 16, mlp_dim: 192}", "sft_warmup.steps=150", "data.eval_size=16"]
    return out


def warm_start(seed: int, run_dir: Path, *, sft_steps: int | None, small: bool, rl_step: bool = True,
               extra: Sequence[str] = ()) -> Path:
    """The SFT warm start alone, as a run directory both methods of a seed start from (one RL step at learning
    rate 1e-12 so that `train` writes a checkpoint; the update is below float32 resolution of the weights).
    `rl_step=False` (the tests): no RL step, the run directory's checkpoint is the warm start's own (step 0)
    and nothing of RL compiles. `extra`: more overrides, applied last."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides("grpo", seed, 1 if rl_step else 0, eval_every=0, alpha=0.0, beta=0.0, updates=1,
                     sft_steps=sft_steps, small=small)
    train(load_config("configs/quickstart.yaml", sets + ["optimizer.lr=1.0e-12", *extra]), run_dir)
    return run_dir


def curves(rows: Sequence[dict], steps: int) -> dict[str, np.ndarray]:
    """Per-step training curves [T] (entropy, clip_frac, reward/mean) and held-out accuracy [E, 2] (step, acc)
    from a run's metrics.jsonl rows."""
    train = {r["step"]: r for r in rows if "entropy" in r}
    if sorted(train) != list(range(1, steps + 1)):
        raise ValueError(f"expected training rows for steps 1..{steps}, got {sorted(train)}")
    out = {k: np.asarray([train[t][k] for t in range(1, steps + 1)], np.float64)
           for k in ("entropy", "clip_frac", "reward/mean")}
    out["eval"] = np.asarray(sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r),
                             np.float64).reshape(-1, 2)
    return out


def run_one(method: str, seed: int, steps: int, run_dir: Path, *, init: Path | None, **kw) -> dict:
    """Trains one run (from the warm-started run directory `init`, or with its own warm start); returns
    `curves` of its metrics."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides(method, seed, steps, **kw)
    if init is not None:
        sets += ["model.preset=null", f"model.checkpoint={init}", "model.overrides={}", "sft_warmup.steps=0"]
    train(load_config("configs/quickstart.yaml", sets), run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return curves(rows, steps)


def report(runs: dict[str, list[dict]], seeds: Sequence[int], out_dir: Path, *, seconds: float,
           setting: str) -> str:
    """Writes etr_vs_grpo.png and etr_vs_grpo.md; returns the markdown."""
    steps = len(runs[METHODS[0]][0]["entropy"])
    k = max(1, steps // 4)
    rows = []
    for m in METHODS:
        ent = np.stack([r["entropy"] for r in runs[m]])
        acc = np.stack([r["eval"][:, 1] for r in runs[m]])
        rows.append([m, common.seed_stats(ent[:, :k].mean(1)).cell(),
                     common.seed_stats(ent[:, -k:].mean(1)).cell(),
                     common.seed_stats([r["clip_frac"].mean() for r in runs[m]]).cell(4),
                     common.seed_stats(acc[:, 0]).cell(), common.seed_stats(acc[:, -1]).cell(),
                     common.seed_stats(acc.max(1)).cell()])
    pairs = list(zip(runs["grpo"], runs["etr"]))
    d_ent = [round(float(e["entropy"][-k:].mean() - g["entropy"][-k:].mean()), 3) for g, e in pairs]
    d_acc = [round(float(e["eval"][-1, 1] - g["eval"][-1, 1]), 3) for g, e in pairs]
    last = int(runs[METHODS[0]][0]["eval"][-1, 0])
    header = ["run", f"entropy, steps 1-{k}", f"entropy, last {k} steps", "clip fraction (mean over steps)",
              "held-out acc. step 0", f"held-out acc. step {last}", "held-out acc. best eval"]
    text = (f"{setting}. Mean ± std [min, max] over seeds. ETR minus GRPO per seed (same warm start and "
            f"rollout keys): entropy of the last {k} steps {d_ent}, final held-out accuracy {d_acc}. "
            f"Wall time {seconds / 60:.1f} min.\n\n"
            + common.markdown_table(header, rows))
    common.write_text(out_dir / "etr_vs_grpo.md", text)
    x_eval = runs[METHODS[0]][0]["eval"][:, 0]
    panels = {
        "policy entropy (nats/token)": {m: np.stack([r["entropy"] for r in runs[m]]) for m in METHODS},
        "held-out greedy accuracy": {m: np.stack([r["eval"][:, 1] for r in runs[m]]) for m in METHODS},
        "training reward": {m: np.stack([r["reward/mean"] for r in runs[m]]) for m in METHODS},
        "clip fraction": {m: np.stack([r["clip_frac"] for r in runs[m]]) for m in METHODS},
    }
    _plot(out_dir / "etr_vs_grpo.png", panels, x_eval)
    return text


def _plot(path: Path, panels: dict, x_eval: np.ndarray) -> None:
    """Training-step panels against step 1..T, the accuracy panel against its evaluation steps."""
    note = ("ETR = documented reading of arXiv:2601.03723 (no public code); line = mean over seeds, "
            "band = min..max")
    acc = {"held-out greedy accuracy": panels.pop("held-out greedy accuracy")}
    common.plot_curves(path, panels, xlabel="RL step", note=note)
    common.plot_curves(path.with_name(path.stem + "_accuracy.png"), acc, xlabel="RL step", x=x_eval,
                       note="ETR: documented reading, no public code\nmean over seeds, band = min..max")


def save_run(path: Path, run: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{k.replace("/", "_"): v for k, v in run.items()})


def load_run(path: Path) -> dict:
    with np.load(path) as z:
        return {k.replace("reward_mean", "reward/mean"): z[k] for k in z.files}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.1, help="ETR micro elasticity (spec's example value)")
    p.add_argument("--beta", type=float, default=0.5, help="ETR macro elasticity (spec's example value)")
    p.add_argument("--updates", type=int, default=2, help="ppo_epochs = mini_batches per RL batch")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT warm-start steps (default: the config's)")
    p.add_argument("--small", action="store_true", help="the CI model (D=64, 2 layers, 150 SFT steps)")
    p.add_argument("--out", type=Path, default=common.DOCS)
    common.add_raw_arguments(p)
    a = p.parse_args(argv)
    timer = common.Timer()
    kw = dict(eval_every=a.eval_every, alpha=a.alpha, beta=a.beta, updates=a.updates, sft_steps=a.sft_steps,
              small=a.small)
    setting = (f"Seeds {a.seeds}, {a.steps} RL steps of 4 prompts x 8 samples, {a.updates} epochs x "
               f"{a.updates} mini-batches per batch, ETR alpha {a.alpha}, beta {a.beta}, held-out greedy "
               f"accuracy on 32 prompts every {a.eval_every} steps")
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    if a.report_only:
        seeds, runs = common.stored_runs(a.raw, a.seeds, list(METHODS), load_run)
        print(report(runs, seeds, a.out, seconds=float("nan"), setting=setting))
        return
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            init = warm_start(seed, Path(tmp) / f"warm{seed}", sft_steps=a.sft_steps, small=a.small)
            print(f"warm start of seed {seed} done at {timer.elapsed():.0f} s", flush=True)
            for m in METHODS:
                runs[m].append(run_one(m, seed, a.steps, Path(tmp) / f"{m}{seed}", init=init, **kw))
                if a.raw is not None:
                    save_run(a.raw / f"{m}{seed}.npz", runs[m][-1])
                print(f"{m} seed {seed} done at {timer.elapsed():.0f} s", flush=True)
    print(report(runs, a.seeds, a.out, seconds=timer.elapsed(), setting=setting))


if __name__ == "__main__":
    main()
