"""Claim 1, GDPO vs GRPO on three binary rewards: GRPO's reward-combination collapse and joint success.

Task: the quickstart's arithmetic ("What is 47 + 3?") after its mixed-format SFT warm start, with three
binary rewards, each weight 1:
  answer  `math_answer` with tags_only (correct number inside <answer></answer>)
  format  `format` with tags [answer]
  length  `length_budget` below: 1 if the completion is at most `budget` tokens (EOS included)
GRPO sums them and normalises the sum within each group, so two different reward vectors with the same sum,
e.g. (1, 1, 0) "right but too long" and (0, 1, 1) "wrong but short", get the same advantage. GDPO (Liu et al.,
arXiv:2601.05242, https://arxiv.org/abs/2601.05242) normalises each reward within the group first.

Collapse count of one group with D distinct reward vectors: D - (number of distinct advantage values among
them), the number of vectors merged into another's advantage; 0 means every vector is told apart (two
vectors with one advantage count 1, three count 2).
Both advantage functions (`jaxrl.losses.group_advantages` on the sum, `jaxrl.losses.gdpo_advantages`) are
applied to the reward vectors each run actually sampled. Joint success: share of rollouts with every reward 1.

The runs go through `jaxrl.rl.loop.train`; the only addition is a recorder around
`jaxrl.rl.loop.rl_step` that keeps each step's rollout rewards [N, K] (the step itself is unchanged).

Run: python -m experiments.gdpo_vs_grpo [--seeds 0 1 2] [--steps 30] [--out docs/experiments]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from experiments import common

NAMES = ("answer", "format", "length")
EXTRA: list[str] = []  # extra overrides of every run (main's --sft-steps)


def length_budget(prompts: list[str], completions: list[str], *, completion_length: list[int],
                  budget: int) -> list[float]:
    """Binary length budget: r = 1[L <= budget], L the generated token count (EOS included)."""
    del prompts, completions
    return [float(int(n) <= budget) for n in completion_length]


def collapse_count(rewards_GR: np.ndarray, adv_G: np.ndarray, tol: float = 1e-4) -> tuple[int, int]:
    """(D, C) of one group: D distinct reward vectors, C = D - (distinct advantage values over them).

    Args:
      rewards_GR: [G, K] reward vectors of one group.
      adv_G: [G] their advantages (a function of the vector within a group, for GRPO and GDPO alike).
      tol: advantages closer than this count as equal.

    Returns:
      (D, D - number of distinct advantage values over the D vectors).
    """
    rewards_GR, adv_G = np.asarray(rewards_GR, np.float64), np.asarray(adv_G, np.float64)
    _, first = np.unique(rewards_GR, axis=0, return_index=True)
    adv_D = np.sort(adv_G[first])
    distinct_adv = 1 + int(np.sum(np.diff(adv_D) > tol)) if adv_D.size else 0
    return int(adv_D.size), int(adv_D.size - distinct_adv)


def advantages(rewards_BR: np.ndarray, group_size: int, method: str) -> np.ndarray:
    """[N] sequence advantages of `method` ('grpo': summed reward, group-normalised; 'gdpo': per reward, summed,
    batch-standardised), from the library's functions, equal reward weights."""
    import jax.numpy as jnp

    from jaxrl import losses

    r_BR = jnp.asarray(rewards_BR, jnp.float32)
    if method == "grpo":
        return np.asarray(losses.group_advantages(r_BR.sum(axis=1), group_size))
    return np.asarray(losses.gdpo_advantages(r_BR, group_size))


def step_collapse(rewards_BR: np.ndarray, group_size: int, method: str) -> tuple[float, float]:
    """(mean distinct vectors per group, mean collapsed vectors per group) of one step's rollouts."""
    adv_B = advantages(rewards_BR, group_size, method)
    counts = [collapse_count(rewards_BR[i:i + group_size], adv_B[i:i + group_size])
              for i in range(0, len(adv_B), group_size)]
    d, c = np.asarray(counts, np.float64).T
    return float(d.mean()), float(c.mean())


@contextlib.contextmanager
def recording() -> Iterator[list[np.ndarray]]:
    """Within the block, every `train` step's rollout rewards [N, K] are appended to the yielded list."""
    from jaxrl.rl import loop as rl_loop

    log: list[np.ndarray] = []
    real = rl_loop.rl_step

    def recorded(run, state, records, step, **kw):
        state, metrics, ro = real(run, state, records, step, **kw)
        log.append(np.asarray(ro.rewards_BR, np.float64).copy())
        return state, metrics, ro

    rl_loop.rl_step = recorded
    try:
        yield log
    finally:
        rl_loop.rl_step = real


def overrides(method: str, seed: int, steps: int, *, budget: int, small: bool) -> list[str]:
    """`--set` overrides of configs/quickstart.yaml for one run."""
    rewards = [
        {"name": "answer", "type": "math_answer", "weight": 1.0, "params": {"tags_only": True}},
        {"name": "format", "type": "format", "weight": 1.0, "params": {"tags": ["answer"]}},
        {"name": "length", "type": "function", "function": "experiments.gdpo_vs_grpo:length_budget",
         "weight": 1.0, "params": {"budget": budget}},
    ]
    out = [f"algorithm.name={method}", f"rewards={json.dumps(rewards)}", f"train.steps={steps}",
           f"train.seed={seed}", f"data.seed={seed}", f"train.eval_every={steps}",
           "checkpoint.every=100000", "checkpoint.async_save=false", "logging.tensorboard=false",
           "logging.progress_bar=false", "logging.sample_every=100000", "data.prompts_per_step=4",
           "data.eval_size=32"]
    out += EXTRA
    if small:  # CI: a smaller model and warm start
        out += ["model.overrides={hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,"
                " mlp_dim: 192}", "sft_warmup.steps=150", "data.eval_size=16"]
    return out


def warm_start(seed: int, run_dir: Path, *, small: bool) -> Path:
    """The quickstart's SFT warm start alone, saved as a run directory both methods of a seed start from.

    `train` checkpoints after its RL steps only, so this runs one RL step at learning rate 1e-12 (an update of
    ~1e-12 per weight, below float32 resolution of the weights), which leaves the warm-started weights.
    """
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    cfg = load_config("configs/quickstart.yaml", overrides("grpo", seed, 1, budget=10**6, small=small)
                      + ["optimizer.lr=1.0e-12", "train.eval_every=0"])
    train(cfg, run_dir)
    return run_dir


def run_one(method: str, seed: int, steps: int, run_dir: Path, *, budget: int, small: bool,
            init: Path | None = None, extra: Sequence[str] = ()) -> dict:
    """Trains one run (from the warm-started run directory `init`, or with its own warm start); returns its
    per-step rewards [T, N, K], the metrics rows and the held-out accuracy by step. `extra`: more overrides,
    applied last."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides(method, seed, steps, budget=budget, small=small)
    if init is not None:
        sets += ["model.preset=null", f"model.checkpoint={init}", "model.overrides={}", "sft_warmup.steps=0"]
    sets += list(extra)
    cfg = load_config("configs/quickstart.yaml", sets)
    with recording() as log:
        last = train(cfg, run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    return {"rewards_TBR": np.stack(log), "last": last, "eval_accuracy": evals, "rows": rows,
            "group_size": cfg.rollout.group_size}


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict[str, np.ndarray]]:
    """Per method: joint success [S, T], reward means [S, T, K], collapse of its own advantage and of the other
    method's on the same rollouts [S, T]."""
    out = {}
    for method, seeds in runs.items():
        joint, means, col_grpo, col_gdpo, distinct = [], [], [], [], []
        for r in seeds:
            r_TBR, g = r["rewards_TBR"], r["group_size"]
            joint.append((r_TBR == 1).all(axis=2).mean(axis=1))
            means.append(r_TBR.mean(axis=1))
            cg = [step_collapse(r_BR, g, "grpo") for r_BR in r_TBR]
            cd = [step_collapse(r_BR, g, "gdpo") for r_BR in r_TBR]
            distinct.append([d for d, _ in cg])
            col_grpo.append([c for _, c in cg])
            col_gdpo.append([c for _, c in cd])
        out[method] = {"joint_ST": np.asarray(joint), "means_STK": np.asarray(means),
                       "distinct_ST": np.asarray(distinct), "collapse_grpo_ST": np.asarray(col_grpo),
                       "collapse_gdpo_ST": np.asarray(col_gdpo)}
    return out


def report(runs: dict[str, list[dict]], seeds: Sequence[int], out_dir: Path, *, seconds: float,
           budget: int, steps: int) -> str:
    """Writes gdpo_vs_grpo.png and gdpo_vs_grpo.md into `out_dir`; returns the table."""
    s = summarise(runs)
    k = max(1, steps // 3)
    rows = []
    for method in runs:
        m = s[method]
        first, last = m["joint_ST"][:, :k].mean(axis=1), m["joint_ST"][:, -k:].mean(axis=1)
        acc = [r["eval_accuracy"].get(steps, np.nan) for r in runs[method]]
        acc0 = [r["eval_accuracy"].get(0, np.nan) for r in runs[method]]
        rows.append([method, common.seed_stats(m["distinct_ST"].mean(axis=1)).cell(2),
                     common.seed_stats(m["collapse_grpo_ST"].mean(axis=1)).cell(2),
                     common.seed_stats(m["collapse_gdpo_ST"].mean(axis=1)).cell(2),
                     common.seed_stats(first).cell(), common.seed_stats(last).cell(),
                     common.seed_stats(acc0).cell(), common.seed_stats(acc).cell()])
    header = ["run", "distinct reward vectors / group", "collapsed vectors / group (GRPO adv.)",
              "collapsed vectors / group (GDPO adv.)", f"joint success, steps 1-{k}",
              f"joint success, last {k} steps", "held-out acc. step 0", f"held-out acc. step {steps}"]
    table = common.markdown_table(header, rows)
    text = (f"Seeds {list(seeds)}, {steps} RL steps, length budget {budget} tokens; mean ± std [min, max] over "
            f"seeds. Wall time {seconds / 60:.1f} min.\n\n" + table)
    common.write_text(out_dir / "gdpo_vs_grpo.md", text)
    panels = {
        "joint success (all 3 rewards = 1)": {m: s[m]["joint_ST"] for m in runs},
        "collapsed vectors / group (GRPO advantage)": {m: s[m]["collapse_grpo_ST"] for m in runs},
        "answer reward": {m: s[m]["means_STK"][:, :, 0] for m in runs},
        "length reward": {m: s[m]["means_STK"][:, :, 2] for m in runs},
    }
    common.plot_curves(out_dir / "gdpo_vs_grpo.png", panels, xlabel="RL step",
                       note="training rollouts; line = mean over seeds, band = min..max")
    return text


def save_run(path: Path, run: dict) -> None:
    """One finished run as an .npz (rewards [T, N, K], group size, held-out accuracy by step)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    acc = np.asarray(sorted(run["eval_accuracy"].items()), np.float64).reshape(-1, 2)
    np.savez(path, rewards_TBR=run["rewards_TBR"], group_size=run["group_size"], eval_accuracy=acc)


def load_run(path: Path) -> dict:
    """Inverse of `save_run`."""
    z = np.load(path)
    return {"rewards_TBR": z["rewards_TBR"], "group_size": int(z["group_size"]),
            "eval_accuracy": {int(s): float(a) for s, a in z["eval_accuracy"]}}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--budget", type=int, default=20)
    p.add_argument("--small", action="store_true", help="the CI model (D=64, 2 layers, 150 SFT steps)")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT warm-start steps (default: the config's)")
    p.add_argument("--out", type=Path, default=common.DOCS)
    common.add_raw_arguments(p)
    a = p.parse_args(argv)
    timer = common.Timer()
    runs: dict[str, list[dict]] = {"grpo": [], "gdpo": []}
    if a.report_only:
        seeds, runs = common.stored_runs(a.raw, a.seeds, list(runs), load_run)
        print(report(runs, seeds, a.out, seconds=float("nan"), budget=a.budget, steps=a.steps))
        return
    if a.sft_steps is not None:
        global EXTRA
        EXTRA = [f"sft_warmup.steps={a.sft_steps}"]
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            init = warm_start(seed, Path(tmp) / f"warm{seed}", small=a.small)
            print(f"warm start of seed {seed} done at {timer.elapsed():.0f} s", flush=True)
            for method in runs:
                runs[method].append(run_one(method, seed, a.steps, Path(tmp) / f"{method}{seed}",
                                            budget=a.budget, small=a.small, init=init))
                if a.raw is not None:
                    save_run(a.raw / f"{method}{seed}.npz", runs[method][-1])
                print(f"{method} seed {seed} done at {timer.elapsed():.0f} s", flush=True)
    print(report(runs, a.seeds, a.out, seconds=timer.elapsed(), budget=a.budget, steps=a.steps))


if __name__ == "__main__":
    main()
