"""Claim 7, AFRL's SFT-auxiliary loss vs plain GRPO on a long-tail task: is the rare rule forgotten?

AFRL (arXiv:2602.10006; no public code, `algorithm.name: sft_aux` is jaxrl's documented reading,
../shared/spec/algorithms.md section 7g): L = L_GRPO + lambda_SFT * L_SFT, L_SFT the NLL of expert targets for
the prompts of the RL batch (`jaxrl.algorithms.sft_aux.expert_rows`). The paper's claim: RL is mode-seeking
and forgets long-tail rules that SFT taught; the SFT term keeps them.

Task: the quickstart's arithmetic with a long tail: `data.params.ops` = 13 x "+" and 1 x "-", so about 7% of
the prompts are subtractions ("What is 47 - 3?"), in the SFT warm start and in RL alike. Demonstrations and
the reward use one format, "<answer>{answer}</answer>"; the only reward is `math_answer` with tags_only.
Each seed's runs start from one shared SFT warm start (the seeds differ in RL data and rollout keys).

Measured: greedy accuracy on two fixed held-out sets of 64 prompts each, all-subtraction (rare rule) and
all-addition (common rule), every `eval_every` steps, by a recorder around `jaxrl.rl.loop.evaluate` that
scores the two sets next to the trainer's own held-out set (the trainer's evaluation is unchanged).

Run: python -m experiments.afrl_vs_grpo [--seeds 0 1 2] [--steps 30] [--lam 0.1] [--raw DIR] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from experiments import common

METHODS = ("grpo", "sft_aux")
OPS = "+" * 13 + "-"
PARAMS = {"max_operand": 99, "max_second": 3}
SMALL = ["model.overrides={hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,"
         " mlp_dim: 192}", "sft_warmup.steps=150"]


def probe_sets(n: int, seed: int = 1000) -> dict[str, list[dict]]:
    """Held-out probes: `n` subtraction ("rare") and `n` addition ("common") prompts of the task's ranges."""
    from jaxrl.data.tasks import load_records

    return {rule: load_records("arithmetic", n, seed, params={**PARAMS, "ops": op})
            for rule, op in (("rare", "-"), ("common", "+"))}


probing = common.probing  # the held-out evaluation wrapper (kept under this name for its test)


def overrides(method: str, seed: int, steps: int, *, eval_every: int, lam: float) -> list[str]:
    """`--set` overrides of configs/quickstart.yaml for one run."""
    reward = [{"name": "answer", "type": "math_answer", "weight": 1.0, "params": {"tags_only": True}}]
    out = [f"algorithm.name={method}", f"rewards={json.dumps(reward)}", f"train.steps={steps}",
           f"train.seed={seed}", f"data.seed={seed}", f"train.eval_every={eval_every}",
           f"data.params={json.dumps({**PARAMS, 'ops': OPS})}",
           'data.target_formats=["<answer>{answer}</answer>"]', "data.prompts_per_step=4",
           "data.eval_size=16",
           "checkpoint.every=100000", "checkpoint.async_save=false", "logging.tensorboard=false",
           "logging.progress_bar=false", "logging.sample_every=100000"]
    if method == "sft_aux":
        out += [f"algorithm.params.lam={lam}"]
    return out


def warm_start(run_dir: Path, *, sft_steps: int | None, small: bool, rl_step: bool = True,
               extra: Sequence[str] = ()) -> Path:
    """The SFT warm start alone as a run directory (one RL step at learning rate 1e-12 so that `train` writes
    a checkpoint; the update is below float32 resolution of the weights). `rl_step=False` (the tests): no RL
    step, the run directory's checkpoint is the warm start's own (step 0) and nothing of RL compiles.
    `extra`: more overrides, applied last."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides("grpo", 0, 1 if rl_step else 0, eval_every=0, lam=0.0) + ["optimizer.lr=1.0e-12"]
    sets += SMALL if small else []
    sets += [f"sft_warmup.steps={sft_steps}"] if sft_steps is not None else []
    train(load_config("configs/quickstart.yaml", [*sets, *extra]), run_dir)
    return run_dir


def run_one(method: str, seed: int, steps: int, run_dir: Path, *, init: Path, eval_every: int, lam: float,
            probes: dict[str, list[dict]], extra: Sequence[str] = ()) -> dict:
    """Trains one run from the warm start `init` (`extra`: more overrides); returns probe accuracy [E, 2]
    (rare, common) at the eval steps [E], the training reward [T] and the SFT-aux NLL [T] (NaN for GRPO)."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    sets = overrides(method, seed, steps, eval_every=eval_every, lam=lam)
    sets += ["model.preset=null", f"model.checkpoint={init}", "model.overrides={}", "sft_warmup.steps=0",
             *extra]
    with probing(probes) as log:
        train(load_config("configs/quickstart.yaml", sets), run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = sorted((r for r in rows if "reward/mean" in r), key=lambda r: r["step"])
    eval_steps = sorted(r["step"] for r in rows if "eval/accuracy" in r)
    if len(eval_steps) != len(log):
        raise RuntimeError(f"{len(log)} probe evaluations for eval steps {eval_steps}")
    return {"eval_steps": np.asarray(eval_steps, np.float64),
            "probe": np.asarray([[e["rare"], e["common"]] for e in log], np.float64),
            "reward": np.asarray([r["reward/mean"] for r in train_rows], np.float64),
            "sft_nll": np.asarray([r.get("sft/nll", np.nan) for r in train_rows], np.float64)}


def report(runs: dict[str, list[dict]], seeds: Sequence[int], out_dir: Path, *, seconds: float,
           setting: str) -> str:
    """Writes afrl_vs_grpo.png and afrl_vs_grpo.md into `out_dir`; returns the markdown."""
    last = int(runs[METHODS[0]][0]["eval_steps"][-1])
    rows = []
    for m in METHODS:
        p = np.stack([r["probe"] for r in runs[m]])  # [S, E, 2]
        cells = [common.seed_stats(p[:, e, k]).cell() for k in (0, 1) for e in (0, -1)]
        rows.append([m, *cells, common.seed_stats(p[:, -1, 0] - p[:, 0, 0]).cell()])
    d_rare = [round(float(a["probe"][-1, 0] - g["probe"][-1, 0]), 3) for g, a in zip(*runs.values())]
    header = ["run", "rare (-) acc. step 0", f"rare (-) acc. step {last}", "common (+) acc. step 0",
              f"common (+) acc. step {last}", "rare acc. change"]
    text = (f"{setting}. Mean ± std [min, max] over seeds {list(seeds)}; SFT-aux minus GRPO final rare "
            f"accuracy per seed {d_rare}. Wall time {seconds / 60:.1f} min.\n\n"
            + common.markdown_table(header, rows))
    common.write_text(out_dir / "afrl_vs_grpo.md", text)
    x = runs[METHODS[0]][0]["eval_steps"]
    panels = {title: {m: np.stack([r["probe"][:, k] for r in runs[m]]) for m in METHODS}
              for title, k in (("rare rule (subtraction): greedy acc.", 0),
                               ("common rule (addition): greedy acc.", 1))}
    common.plot_curves(out_dir / "afrl_vs_grpo.png", panels, xlabel="RL step", x=x,
                       note="AFRL SFT-aux = documented reading (no public code); 64 probes per rule; "
                            "line = mean over seeds, band = min..max")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--lam", type=float, default=0.1, help="lambda_SFT (the spec's example value)")
    p.add_argument("--sft-steps", type=int, default=500)
    p.add_argument("--probes", type=int, default=64, help="held-out prompts per rule")
    p.add_argument("--out", type=Path, default=common.DOCS)
    p.add_argument("--init", type=Path, default=None,
                   help="an existing warm-start run directory of this task (a copy of one this script made)")
    common.add_raw_arguments(p)
    a = p.parse_args(argv)
    timer = common.Timer()
    setting = (f"{a.steps} RL steps of 4 prompts x 8 samples, one shared {a.sft_steps}-step SFT warm start, "
               f"7% subtraction prompts, lambda_SFT {a.lam}, {a.probes} probe prompts per rule")
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    if a.report_only:
        seeds, runs = common.stored_runs(a.raw, a.seeds, list(METHODS), common.load_arrays)
        print(report(runs, seeds, a.out, seconds=float("nan"), setting=setting))
        return
    probes = probe_sets(a.probes)
    with tempfile.TemporaryDirectory() as tmp:
        init = a.init or warm_start(Path(tmp) / "warm", sft_steps=a.sft_steps, small=False)
        print(f"warm start done at {timer.elapsed():.0f} s", flush=True)
        for seed in a.seeds:
            for m in METHODS:
                runs[m].append(run_one(m, seed, a.steps, Path(tmp) / f"{m}{seed}", init=init,
                                       eval_every=a.eval_every, lam=a.lam, probes=probes))
                if a.raw is not None:
                    common.save_arrays(a.raw / f"{m}{seed}.npz", runs[m][-1])
                print(f"{m} seed {seed} done at {timer.elapsed():.0f} s {runs[m][-1]['probe'].tolist()}",
                      flush=True)
    print(report(runs, a.seeds, a.out, seconds=timer.elapsed(), setting=setting))


if __name__ == "__main__":
    main()
