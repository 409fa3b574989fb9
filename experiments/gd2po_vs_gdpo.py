"""Claim 2, GD²PO vs GDPO on a conflicting reward pair: the fraction of conflicting groups and the outcome.

Task: the quickstart's arithmetic ("What is 47 + 3?") after its mixed-format SFT warm start (demonstrations
"<answer>50</answer>", "The answer is 50.", "50", "So it is 50.", one in four each), with two binary rewards
of weight 1 that pull apart:
  answer  `math_answer` (any format: the last number of the text is checked)
  length  `experiments.gdpo_vs_grpo:length_budget` with a budget of 4 tokens (EOS included)
Only the bare format ("50" + EOS, 3 tokens) fits the budget, so a correct answer in any other format breaks it
and a wrong bare answer meets it: within a group, "right but long" and "wrong but short" samples have
per-reward advantages of opposite signs. Joint success (both rewards 1) is a correct bare answer.

GD²PO (arXiv:2606.16771, `algorithm.name: gd2po`, `losses.gd2po_advantages`) drops conflicting samples (hard:
all of them; snr: those with |s_i| < tau) and scales each group by its kept share; GDPO keeps every sample.
Conflict is the library's definition (`losses.gd2po_advantages`): sample i conflicts when one reward's
token-summed group advantage is > 1e-8 and another's < -1e-8. A group conflicts when any of its samples
does; both fractions are computed by calling `gd2po_advantages` on each group of the rewards every run
actually sampled (so they are measured on GDPO's rollouts too).

Run: python -m experiments.gd2po_vs_gdpo [--seeds 0 1 2] [--steps 15] [--raw DIR] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from experiments import common
from experiments.gdpo_vs_grpo import load_run, recording, save_run

METHODS = ("gdpo", "gd2po_hard", "gd2po_snr")
SMALL = ["model.overrides={hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,"
         " mlp_dim: 192}", "sft_warmup.steps=150", "data.eval_size=16"]  # CI: a smaller model


def group_conflicts(rewards_BR: np.ndarray, group_size: int) -> tuple[float, float]:
    """(share of groups with a conflicting sample, share of conflicting samples) of one step's rewards.

    Each group goes through `losses.gd2po_advantages` (hard mode, all-ones mask) alone, so its
    `gd2po/conflict_frac` is that group's share of conflicting samples by the library's definition.
    """
    import jax.numpy as jnp

    from jaxrl import losses

    fracs = []
    for i in range(0, rewards_BR.shape[0], group_size):
        r_GR = jnp.asarray(rewards_BR[i:i + group_size], jnp.float32)
        _, m = losses.gd2po_advantages(r_GR, group_size, jnp.ones((group_size, 1), bool), mode="hard")
        fracs.append(float(m["gd2po/conflict_frac"]))
    f_P = np.asarray(fracs)
    return float(np.mean(f_P > 0)), float(np.mean(f_P))


def overrides(method: str, seed: int, steps: int, *, budget: int, tau: float, sft_steps: int | None,
              eval_every: int | None = None) -> list[str]:
    """`--set` overrides of configs/quickstart.yaml for one run ('gd2po_hard' / 'gd2po_snr' pick the mode;
    `eval_every` None: held-out evaluations at steps 0 and `steps`)."""
    rewards = [
        {"name": "answer", "type": "math_answer", "weight": 1.0},
        {"name": "length", "type": "function", "function": "experiments.gdpo_vs_grpo:length_budget",
         "weight": 1.0, "params": {"budget": budget}},
    ]
    name, _, mode = method.partition("_")
    every = steps if eval_every is None else eval_every
    out = [f"algorithm.name={name}", f"rewards={json.dumps(rewards)}", f"train.steps={steps}",
           f"train.seed={seed}", f"data.seed={seed}", f"train.eval_every={every}", "data.prompts_per_step=4",
           "data.eval_size=32", "checkpoint.every=100000", "checkpoint.async_save=false",
           "logging.tensorboard=false", "logging.progress_bar=false", "logging.sample_every=100000"]
    if mode:
        out += [f"algorithm.params.mode={mode}", f"algorithm.params.tau={tau}"]
    if sft_steps is not None:
        out += [f"sft_warmup.steps={sft_steps}"]
    return out


def warm_start(run_dir: Path, *, sft_steps: int | None, small: bool, rl_step: bool = True,
               extra: Sequence[str] = ()) -> Path:
    """The SFT warm start alone as a run directory (one RL step at learning rate 1e-12 so that `train` writes
    a checkpoint; the update is below float32 resolution of the weights). `rl_step=False` (the tests): no RL
    step, the run directory's checkpoint is the warm start's own (step 0) and nothing of RL compiles.
    `extra`: more overrides, applied last."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides("gdpo", 0, 1 if rl_step else 0, budget=4, tau=0.0, sft_steps=sft_steps)
    sets += ["optimizer.lr=1.0e-12", "train.eval_every=0"]
    if small:
        sets += SMALL
    train(load_config("configs/quickstart.yaml", [*sets, *extra]), run_dir)
    return run_dir


def run_one(method: str, seed: int, steps: int, run_dir: Path, *, init: Path, budget: int,
            tau: float, eval_every: int | None = None) -> dict:
    """Trains one run from the warm-started run directory `init`; returns its rewards [T, N, K], group size
    and held-out accuracy by step (as `gdpo_vs_grpo.run_one`; `eval_every` as in `overrides`, 0: none)."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides(method, seed, steps, budget=budget, tau=tau, sft_steps=0, eval_every=eval_every)
    sets += ["model.preset=null", f"model.checkpoint={init}", "model.overrides={}"]
    cfg = load_config("configs/quickstart.yaml", sets)
    with recording() as log:
        train(cfg, run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    return {"rewards_TBR": np.stack(log), "group_size": cfg.rollout.group_size, "eval_accuracy": evals,
            "rows": rows}


def summarise(run: dict) -> dict[str, np.ndarray]:
    """Per-step curves [T] of one run: answer, length, joint success, conflicting groups and samples."""
    r_TBR, g = run["rewards_TBR"], run["group_size"]
    conf = np.asarray([group_conflicts(r_BR, g) for r_BR in r_TBR])
    return {"answer": r_TBR[:, :, 0].mean(1), "length": r_TBR[:, :, 1].mean(1),
            "joint": (r_TBR == 1).all(axis=2).mean(1), "conflict_groups": conf[:, 0],
            "conflict_samples": conf[:, 1]}


def report(runs: dict[str, list[dict]], seeds: Sequence[int], out_dir: Path, *, seconds: float,
           setting: str) -> str:
    """Writes gd2po_vs_gdpo.png and gd2po_vs_gdpo.md into `out_dir`; returns the markdown."""
    s = {m: [summarise(r) for r in runs[m]] for m in runs}
    steps = len(s[METHODS[0]][0]["joint"])
    k = max(1, steps // 3)
    rows = []
    for m in runs:
        st = lambda key, sl: common.seed_stats([c[key][sl].mean() for c in s[m]]).cell()  # noqa: E731
        acc0 = [r["eval_accuracy"].get(0, np.nan) for r in runs[m]]
        acc = [r["eval_accuracy"].get(steps, np.nan) for r in runs[m]]
        rows.append([m, st("conflict_groups", slice(None)), st("conflict_samples", slice(None)),
                     st("joint", slice(0, k)), st("joint", slice(-k, None)), st("answer", slice(-k, None)),
                     st("length", slice(-k, None)), common.seed_stats(acc0).cell(),
                     common.seed_stats(acc).cell()])
    header = ["run", "conflicting groups (all steps)", "conflicting samples (all steps)",
              f"joint success, steps 1-{k}", f"joint success, last {k}", f"answer, last {k}",
              f"length, last {k}", "held-out acc. step 0", f"held-out acc. step {steps}"]
    same = [np.array_equal(a["rewards_TBR"], b["rewards_TBR"])
            for a, b in zip(runs.get("gd2po_hard", []), runs.get("gd2po_snr", []))]
    note = (" gd2po_snr sampled exactly the rewards of gd2po_hard in every seed (it dropped the same"
            " samples)."
            if same and all(same) else "")
    text = (f"{setting}. Mean ± std [min, max] over seeds {list(seeds)}.{note} Wall time {seconds / 60:.1f} "
            "min.\n\n" + common.markdown_table(header, rows))
    common.write_text(out_dir / "gd2po_vs_gdpo.md", text)
    panels = {title: {m: np.stack([c[key] for c in s[m]]) for m in runs}
              for title, key in (("joint success (answer and length = 1)", "joint"),
                                 ("conflicting groups (library definition)", "conflict_groups"),
                                 ("answer reward", "answer"), ("length reward (<= budget)", "length"))}
    common.plot_curves(out_dir / "gd2po_vs_gdpo.png", panels, xlabel="RL step",
                       note="training rollouts; line = mean over seeds, band = min..max"
                       + ("; gd2po_snr = gd2po_hard (hidden under it)" if note else ""))
    return text


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--budget", type=int, default=4)
    p.add_argument("--tau", type=float, default=0.8, help="SNR threshold of gd2po_snr (the paper's scripts)")
    p.add_argument("--sft-steps", type=int, default=500)
    p.add_argument("--out", type=Path, default=common.DOCS)
    common.add_raw_arguments(p)
    a = p.parse_args(argv)
    timer = common.Timer()
    setting = (f"{a.steps} RL steps of 4 prompts x 8 samples, one shared {a.sft_steps}-step SFT warm start, "
               f"length budget {a.budget} tokens, SNR tau {a.tau}")
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    if a.report_only:
        seeds, runs = common.stored_runs(a.raw, a.seeds, list(METHODS), load_run)
        print(report(runs, seeds, a.out, seconds=float("nan"), setting=setting))
        return
    with tempfile.TemporaryDirectory() as tmp:
        init = warm_start(Path(tmp) / "warm", sft_steps=a.sft_steps, small=False)
        print(f"warm start done at {timer.elapsed():.0f} s", flush=True)
        for seed in a.seeds:
            for m in METHODS:
                runs[m].append(run_one(m, seed, a.steps, Path(tmp) / f"{m}{seed}", init=init, budget=a.budget,
                                       tau=a.tau))
                if a.raw is not None:
                    save_run(a.raw / f"{m}{seed}.npz", runs[m][-1])
                print(f"{m} seed {seed} done at {timer.elapsed():.0f} s", flush=True)
    print(report(runs, a.seeds, a.out, seconds=timer.elapsed(), setting=setting))


if __name__ == "__main__":
    main()
