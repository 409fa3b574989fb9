"""Claim 4, CLIPO vs GRPO on a task where an answer can be right for the wrong reason.

CLIPO (arXiv:2603.10101; `algorithm.name: clipo`, ../shared/spec/algorithms.md section 4): a contrastive head
on the mean-pooled final hidden states of the rollouts pulls a group's correct rollouts together and away from
its incorrect ones; each correct rollout's per-anchor loss L_i becomes a reward bonus max(-lam*L_i, -0.5), so
a correct rollout that looks like the failures earns less. The paper's claim: this favours correct answers
reached by consistent reasoning over lucky ones, and held-out accuracy improves.

Task: "What is a + b?" with a <= 99, b <= 9; the demonstrated and rewarded format shows its work,
"a+b=c <answer>c</answer>". Half of the TRAINING prompts carry a cue that gives the answer away,
"What is 47 + 8? (hint: 55)"; held-out prompts never do. In the SFT warm start half of the cued
demonstrations are sloppy: the shown sum is off by 1-3 while the tagged answer is the hint
("47+8=54 <answer>55</answer>"), the pattern of a trace whose conclusion came from a leaked answer.
The only trained reward is `answer` (1 when the tagged answer equals a + b).

A rollout is *correct but inconsistent* (`inconsistent`) when its tagged answer is right but the shown work
does not produce it: no "x+y=z" before the tag, x, y not the prompt's operands, or z != the tagged answer.
Its rate among correct rollouts is logged on cued and uncued training prompts by zero-weight reward columns
(they enter neither the advantage nor CLIPO's correctness, which are weighted sums). Held-out greedy accuracy
and inconsistency are scored on fixed cue-free and cued probe sets by `common.probing`.

CLIPO runs `--head-warmup` head-only steps before its policy updates (the reference scripts'
`critic_warmup`, 14 / 58 steps): a fresh head gives every correct anchor of a group nearly the same loss, a
uniform shift that GRPO's group standardisation removes. Steps are counted from the first policy update.

Run: python -m experiments.clipo_vs_grpo [--seeds 0 1 2] [--steps 30] [--head-warmup 10] [--raw DIR]
     [--report-only]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from experiments import common

METHODS = ("grpo", "clipo")
TALLIES = ("correct_cued", "inconsistent_cued", "correct_uncued", "inconsistent_uncued")
_EQUATION = re.compile(r"(\d+)\s*\+\s*(\d+)\s*=\s*(-?\d+)")
_TAGGED = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")
_PROBLEM = re.compile(r"What is (\d+) \+ (\d+)\?")
SMALL = ["model.overrides={hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,"
         " mlp_dim: 192}"]


def make_records(n: int, seed: int, *, cue_frac: float, sloppy_frac: float, max_operand: int = 99,
                 max_second: int = 9) -> list[dict]:
    """`n` records {prompt, answer (the SFT demonstration), result, cued}: a fraction `cue_frac` of prompts
    carry "(hint: a+b)", and a fraction `sloppy_frac` of the cued ones demonstrate a shown sum off by 1-3."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a, b = int(rng.integers(0, max_operand + 1)), int(rng.integers(0, max_second + 1))
        cued = bool(rng.random() < cue_frac)
        sloppy = cued and bool(rng.random() < sloppy_frac)
        shown = a + b + (int(rng.choice([-3, -2, -1, 1, 2, 3])) if sloppy else 0)
        prompt = f"What is {a} + {b}?" + (f" (hint: {a + b})" if cued else "")
        out.append({"prompt": prompt, "answer": f"{a}+{b}={max(shown, 0)} <answer>{a + b}</answer>",
                    "result": str(a + b), "cued": cued})
    return out


def judge(prompt: str, completion: str, result: str) -> tuple[bool, bool]:
    """(correct, consistent): correct = the tagged answer is `result`; consistent = the first "x+y=z" before
    the tag has the prompt's operands and z equal to the tagged answer."""
    tag = _TAGGED.search(completion)
    if tag is None:
        return False, False
    correct = int(tag.group(1)) == int(result)
    problem = _PROBLEM.search(prompt)
    eq = _EQUATION.search(completion[:tag.start()])
    consistent = (eq is not None and problem is not None and eq.group(1, 2) == problem.group(1, 2)
                  and int(eq.group(3)) == int(tag.group(1)))
    return correct, consistent


def answer(prompts: list[str], completions: list[str], *, result: list) -> list[float]:
    """The trained reward: 1 when the tagged answer is a + b."""
    return [float(judge(p, c, r)[0]) for p, c, r in zip(prompts, completions, result)]


def _tally(prompts, completions, result, *, cued: bool, inconsistent: bool) -> list[float]:
    out = []
    for p, c, r in zip(prompts, completions, result):
        correct, consistent = judge(p, c, r)
        hit = ("(hint:" in p) == cued and correct and (not consistent or not inconsistent)
        out.append(float(hit))
    return out


def correct_cued(prompts, completions, *, result):
    return _tally(prompts, completions, result, cued=True, inconsistent=False)


def inconsistent_cued(prompts, completions, *, result):
    return _tally(prompts, completions, result, cued=True, inconsistent=True)


def correct_uncued(prompts, completions, *, result):
    return _tally(prompts, completions, result, cued=False, inconsistent=False)


def inconsistent_uncued(prompts, completions, *, result):
    return _tally(prompts, completions, result, cued=False, inconsistent=True)


def write_data(path: Path, n: int, *, seed: int = 0, cue_frac: float = 0.5, sloppy_frac: float = 0.5) -> Path:
    """The training prompts as a .jsonl file for `data.source`."""
    recs = make_records(n, seed, cue_frac=cue_frac, sloppy_frac=sloppy_frac)
    return common.write_text(path, "".join(json.dumps(r) + "\n" for r in recs))


def probe_sets(n: int, seed: int = 1000) -> dict[str, list[dict]]:
    """Held-out probes: `n` cue-free and `n` cued prompts (not in the training file: another seed)."""
    return {"uncued": make_records(n, seed, cue_frac=0.0, sloppy_frac=0.0),
            "cued": make_records(n, seed + 1, cue_frac=1.0, sloppy_frac=0.0)}


def overrides(method: str, seed: int, steps: int, data: Path, *, eval_every: int) -> list[str]:
    """`--set` overrides of configs/quickstart.yaml for one run."""
    fn = "experiments.clipo_vs_grpo:"
    rewards = [{"name": "answer", "type": "function", "function": fn + "answer", "weight": 1.0}]
    rewards += [{"name": t, "type": "function", "function": fn + t, "weight": 0.0} for t in TALLIES]
    return [f"algorithm.name={method}", f"rewards={json.dumps(rewards)}", f"train.steps={steps}",
            f"train.seed={seed}", f"data.seed={seed}", f"train.eval_every={eval_every}",
            f"data.source={data}", 'data.target_formats=["{answer}"]', "data.params={}",
            "data.prompts_per_step=4", "data.eval_size=16", "rollout.max_new_tokens=32",
            "rollout.gen_buckets=[32]", "checkpoint.every=100000", "checkpoint.async_save=false",
            "logging.tensorboard=false", "logging.progress_bar=false", "logging.sample_every=100000"]


def warm_start(run_dir: Path, data: Path, *, sft_steps: int, small: bool, rl_step: bool = True,
               extra: Sequence[str] = ()) -> Path:
    """The SFT warm start alone as a run directory (one RL step at learning rate 1e-12 so that `train` writes
    a checkpoint; the update is below float32 resolution of the weights). `rl_step=False` (the tests): no RL
    step, the run directory's checkpoint is the warm start's own (step 0) and nothing of RL compiles.
    `extra`: more overrides, applied last."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides("grpo", 0, 1 if rl_step else 0, data, eval_every=0)
    sets += ["optimizer.lr=1.0e-12", f"sft_warmup.steps={sft_steps}"]
    train(load_config("configs/quickstart.yaml", sets + (SMALL if small else []) + list(extra)), run_dir)
    return run_dir


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def run_one(method: str, seed: int, steps: int, run_dir: Path, *, data: Path, init: Path, eval_every: int,
            probes: dict[str, list[dict]], head_warmup: int = 0, extra: Sequence[str] = ()) -> dict:
    """Trains one run of `steps` policy updates from the warm start `init`; returns at the eval steps [E]
    the probe accuracy and inconsistency [E, 2] (uncued, cued), and per training step [T] the tallies [T, 4]
    (TALLIES order, means over the step's rollouts), the training reward and CLIPO's mean bonus (GRPO: NaN).

    `head_warmup` (CLIPO): that many steps before them train only the contrastive head (the reference's
    `critic_warmup`); they are dropped from the result and the steps counted from the first policy update."""
    if head_warmup % max(eval_every, 1):
        raise ValueError(f"head_warmup {head_warmup} must be a multiple of eval_every {eval_every}")
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides(method, seed, steps + head_warmup, data, eval_every=eval_every)
    sets += [f"algorithm.params.warmup_steps={head_warmup}"] if head_warmup else []
    sets += ["model.preset=null", f"model.checkpoint={init}", "model.overrides={}", "sft_warmup.steps=0",
             *extra]
    with common.probing(probes, metric=None) as log:
        train(load_config("configs/quickstart.yaml", sets), run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = sorted((r for r in rows if "reward/answer/mean" in r), key=lambda r: r["step"])
    eval_steps = sorted(r["step"] for r in rows if "eval/accuracy" in r)
    if len(eval_steps) != len(log):
        raise RuntimeError(f"{len(log)} probe evaluations for eval steps {eval_steps}")
    log = [e for s, e in zip(eval_steps, log) if s >= head_warmup]
    eval_steps = [s - head_warmup for s in eval_steps if s >= head_warmup]
    train_rows = train_rows[head_warmup:]
    sets_ = ("uncued", "cued")
    acc = [[e[s]["eval/accuracy"] for s in sets_] for e in log]
    bad = [[_ratio(e[s][f"eval/reward/inconsistent_{s}/mean"], e[s][f"eval/reward/correct_{s}/mean"])
            for s in sets_] for e in log]
    return {"eval_steps": np.asarray(eval_steps, np.float64), "acc": np.asarray(acc, np.float64),
            "inconsistent": np.asarray(bad, np.float64),
            "tallies": np.asarray([[r[f"reward/{t}/mean"] for t in TALLIES] for r in train_rows], np.float64),
            "reward": np.asarray([r["reward/answer/mean"] for r in train_rows], np.float64),
            "bonus": np.asarray([r.get("clipo/bonus_mean", np.nan) for r in train_rows], np.float64)}


def inconsistency_rate(tallies_TK: np.ndarray, window: int) -> np.ndarray:
    """[W, 2] (cued, uncued) inconsistent / correct rollouts over consecutive windows of `window` steps (a
    ratio of sums: the number of cued prompts differs from step to step); NaN where a window has no correct
    rollout."""
    t = tallies_TK.shape[0] // window * window
    w = tallies_TK[:t].reshape(-1, window, len(TALLIES)).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.stack([w[:, 1] / w[:, 0], w[:, 3] / w[:, 2]], axis=1)


def _cell(values: np.ndarray) -> str:
    """A table cell over the seeds with a value (NaN: no correct rollout to take a rate of)."""
    ok = np.asarray(values)[np.isfinite(values)]
    if ok.size == 0:
        return "n/a"
    return common.seed_stats(ok).cell() + (f" (n={ok.size})" if ok.size < np.size(values) else "")


def report(runs: dict[str, list[dict]], seeds: Sequence[int], out_dir: Path, *, seconds: float, window: int,
           setting: str) -> str:
    """Writes clipo_vs_grpo.png and clipo_vs_grpo.md into `out_dir`; returns the markdown."""
    last = int(runs[METHODS[0]][0]["eval_steps"][-1])
    # [S, W, 2] per method
    rates = {m: np.stack([inconsistency_rate(r["tallies"], window) for r in runs[m]]) for m in METHODS}
    rows = []
    for m in METHODS:
        acc, bad = np.stack([r["acc"] for r in runs[m]]), np.stack([r["inconsistent"] for r in runs[m]])
        cells = [_cell(acc[:, e, 0]) for e in (0, -1)] + [_cell(acc[:, -1, 1]), _cell(bad[:, -1, 1])]
        cells += [_cell(rates[m][:, w, k]) for k, w in ((0, 0), (0, -1), (1, 0), (1, -1))]
        rows.append([m, *cells])
    d_acc = [round(float(c["acc"][-1, 0] - g["acc"][-1, 0]), 3) for g, c in zip(*runs.values())]
    d_bad = np.round(rates["clipo"][:, -1, 0] - rates["grpo"][:, -1, 0], 3).tolist()
    n_w = rates[METHODS[0]].shape[1]
    first, final = f"steps 1-{window}", f"steps {(n_w - 1) * window + 1}-{n_w * window}"
    header = ["run", "held-out acc. step 0", f"held-out acc. step {last}", f"cued probe acc. step {last}",
              f"cued probe inconsistent step {last}", f"train cued inconsistent {first}",
              f"train cued inconsistent {final}", f"train uncued inconsistent {first}",
              f"train uncued inconsistent {final}"]
    text = (f"{setting}. Mean ± std [min, max] over seeds {list(seeds)}. 'inconsistent' = correct rollouts "
            "whose shown sum does not produce the tagged answer, as a fraction of the correct ones. CLIPO "
            f"minus GRPO per seed: final held-out accuracy {d_acc}, last-window cued training inconsistency "
            f"{d_bad}. "
            f"Wall time {seconds / 60:.1f} min.\n\n" + common.markdown_table(header, rows))
    common.write_text(out_dir / "clipo_vs_grpo.md", text)
    x_eval, x_window = runs[METHODS[0]][0]["eval_steps"], window * np.arange(1, n_w + 1)
    curves = {"held-out (cue-free) greedy acc.": {m: np.stack([r["acc"][:, 0] for r in runs[m]])
                                                  for m in METHODS},
              "train: inconsistent / correct, cued": {m: rates[m][:, :, 0] for m in METHODS},
              "train: inconsistent / correct, uncued": {m: rates[m][:, :, 1] for m in METHODS}}
    _plot(out_dir / "clipo_vs_grpo.png", curves, (x_eval, x_window, x_window))
    return text


def _plot(path: Path, curves: dict, xs_panels: Sequence[np.ndarray]) -> None:
    """One panel per curve set, each with its own x values (eval steps, window ends); mean and min..max band
    over seeds, NaN-aware (a seed without correct rollouts in a window has no rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 3.6))
    for ax, (title, series), xs in zip(axes, curves.items(), xs_panels):
        for label, v_ST in series.items():
            line, = ax.plot(xs, np.nanmean(v_ST, axis=0), marker="o", label=f"{label} (n={v_ST.shape[0]})")
            ax.fill_between(xs, np.nanmin(v_ST, axis=0), np.nanmax(v_ST, axis=0), color=line.get_color(),
                            alpha=0.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    note = ("line = mean over seeds, band = min..max; training panels: ratio of sums over windows of steps "
            "(x = window end); CLIPO's steps counted after its head-only warm-up")
    fig.text(0.01, 0.01, note, fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--window", type=int, default=10, help="steps per point of the training inconsistency")
    p.add_argument("--head-warmup", type=int, default=10,
                   help="CLIPO steps that train only the head before its policy updates (reference: 14, 58)")
    p.add_argument("--sft-steps", type=int, default=500)
    p.add_argument("--probes", type=int, default=64, help="held-out prompts per probe set")
    p.add_argument("--small", action="store_true", help="a 2-layer D=64 model (the CI size)")
    p.add_argument("--out", type=Path, default=common.DOCS)
    p.add_argument("--init", type=Path, default=None,
                   help="an existing warm-start run directory of this task (a copy of one this script made)")
    common.add_raw_arguments(p)
    a = p.parse_args(argv)
    timer = common.Timer()
    setting = (f"{a.steps} RL steps of 4 prompts x 8 samples, one shared {a.sft_steps}-step SFT warm start"
               f"{' (2-layer D=64 model)' if a.small else ''}, half of the training prompts cued, half of "
               f"the cued demonstrations sloppy, CLIPO with {a.head_warmup} head-only steps before its "
               f"{a.steps} policy updates, {a.probes} probe prompts per set")
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    if a.report_only:
        seeds, runs = common.stored_runs(a.raw, a.seeds, list(METHODS), common.load_arrays)
        print(report(runs, seeds, a.out, seconds=float("nan"), window=a.window, setting=setting))
        return
    probes = probe_sets(a.probes)
    with tempfile.TemporaryDirectory() as tmp:
        data = write_data(Path(tmp) / "train.jsonl", 4000)
        init = a.init or warm_start(Path(tmp) / "warm", data, sft_steps=a.sft_steps, small=a.small)
        print(f"warm start done at {timer.elapsed():.0f} s", flush=True)
        for seed in a.seeds:
            for m in METHODS:
                runs[m].append(run_one(m, seed, a.steps, Path(tmp) / f"{m}{seed}", data=data, init=init,
                                       eval_every=a.eval_every, probes=probes,
                                       head_warmup=a.head_warmup if m == "clipo" else 0))
                if a.raw is not None:
                    common.save_arrays(a.raw / f"{m}{seed}.npz", runs[m][-1])
                r = runs[m][-1]
                print(f"{m} seed {seed} done at {timer.elapsed():.0f} s acc {r['acc'].tolist()} "
                      f"rate {inconsistency_rate(r['tallies'], a.window).tolist()}", flush=True)
    print(report(runs, a.seeds, a.out, seconds=timer.elapsed(), window=a.window, setting=setting))


if __name__ == "__main__":
    main()
