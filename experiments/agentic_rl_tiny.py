"""Issue 29 item 1: an agentic task where RL, not the warm start, makes the gain (configs/agentic_rl_tiny.yaml).

Per seed (`train.seed`: initialisation, warm-start order, sampling), `jaxrl train configs/agentic_rl_tiny.yaml`
as it is: an SFT warm start on demonstrations that never solve the task (60% answer a guessed code without the
tool, 40% query one of the 4 fields drawn uniformly with `<get>field</get>` and copy the code read: tool
syntax, answer format and copying, never which field to ask), then GRPO, evaluated greedily on the held-out
people every `train.eval_every` steps. Reported: held-out accuracy (mean and min..max over seeds) against
the no-tool baseline (1/16, guessing a code), and, from the sampled training episodes, tool calls and turns
per episode and the share whose query names the asked field (`reward/right_field/mean`, a weight-0 reward
column).

Run: python -m experiments.agentic_rl_tiny [--seeds 0 1 2] [--out docs/agentic_rl_tiny]
     [--raw DIR] [--report-only]       (writes OUT.png and OUT.json; --raw keeps each seed's curves)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from experiments import common

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "agentic_rl_tiny.yaml"
BASELINE = 1 / 16  # guessing one of the 16 codes without the tool
TRAIN_KEYS = {"tool_calls": "episode/tool_calls", "turns": "episode/turns",
              "right_field": "reward/right_field/mean", "reward": "reward/env/mean"}


def run(seed: int, run_dir: Path) -> dict[str, np.ndarray]:
    """One seed of the config: {"eval_step", "accuracy", "eval_right_field", "step", <TRAIN_KEYS>, "minutes"}."""
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    timer = common.Timer()
    train(load_config(CONFIG, [*common.QUIET, f"train.seed={seed}"]), run_dir)
    minutes = timer.elapsed() / 60
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if TRAIN_KEYS["reward"] in r]
    out = {"eval_step": np.asarray([r["step"] for r in evals]),
           "accuracy": np.asarray([r["eval/accuracy"] for r in evals]),
           "eval_right_field": np.asarray([r["eval/reward/right_field/mean"] for r in evals]),
           "step": np.asarray([r["step"] for r in steps]), "minutes": np.asarray(minutes)}
    out.update({k: np.asarray([r[key] for r in steps]) for k, key in TRAIN_KEYS.items()})
    return out


def smooth(v_ST: np.ndarray, width: int = 10) -> np.ndarray:
    """A trailing mean over `width` steps of each row (the sampled metrics of 16 prompts are noisy)."""
    c = np.cumsum(np.pad(v_ST, ((0, 0), (1, 0))), axis=1)
    n = np.minimum(np.arange(1, v_ST.shape[1] + 1), width)
    idx = np.arange(1, v_ST.shape[1] + 1)
    return (c[:, idx] - c[:, idx - n]) / n


def report(runs: list[dict[str, np.ndarray]], seeds: list[int], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = runs[0]["eval_step"]
    acc_SE = np.stack([r["accuracy"] for r in runs])
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ax = axes[0]
    for label, v_SE in (("greedy accuracy", acc_SE),
                        ("greedy: queries the asked field", np.stack([r["eval_right_field"] for r in runs]))):
        line, = ax.plot(ev, v_SE.mean(0), marker="o", label=f"{label} (n={len(runs)})")
        ax.fill_between(ev, v_SE.min(0), v_SE.max(0), color=line.get_color(), alpha=0.2)
    ax.axhline(BASELINE, color="k", ls="--", lw=1, label="no-tool baseline (1/16)")
    ax.set(title="held-out people", xlabel="GRPO step", ylim=(0, 1.02))
    st = runs[0]["step"]
    for ax, keys, title in ((axes[1], ("right_field", "reward"), "training episodes (T = 1, 10-step mean)"),
                            (axes[2], ("tool_calls", "turns"), "training episodes: per episode")):
        for k in keys:
            v_ST = smooth(np.stack([r[k] for r in runs])) if ax is axes[1] else np.stack([r[k] for r in runs])
            label = {"right_field": "queries the asked field", "reward": "reward (correct answer)",
                     "tool_calls": "tool calls", "turns": "turns"}[k]
            line, = ax.plot(st, v_ST.mean(0), label=f"{label} (n={len(runs)})")
            ax.fill_between(st, v_ST.min(0), v_ST.max(0), color=line.get_color(), alpha=0.2)
        ax.set(title=title, xlabel="GRPO step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("configs/agentic_rl_tiny.yaml: the warm start teaches <get>field</get>, the answer format and "
                 "copying; GRPO learns to call the tool and which field to ask (mean, min..max over seeds)",
                 fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)
    rows = [[s, f"{r['accuracy'][0]:.3f}", f"{r['accuracy'][-1]:.3f}", f"{r['accuracy'][-1] - r['accuracy'][0]:+.3f}",
             f"{float(r['minutes']):.1f}"] for s, r in zip(seeds, runs)]
    gain = common.seed_stats([r["accuracy"][-1] - r["accuracy"][0] for r in runs])
    table = common.markdown_table(["seed", "step 0 (after warm start)", f"step {int(ev[-1])}", "gain", "minutes"], rows)
    return f"{table}\nno-tool baseline {BASELINE:.4f}; gain over seeds {gain.cell()}\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=Path("docs/agentic_rl_tiny"))
    common.add_raw_arguments(p)
    args = p.parse_args()
    load = common.load_arrays
    if args.report_only:
        seeds, stored = common.stored_runs(args.raw, args.seeds, ["seed"], load)
        runs = stored["seed"]
    else:
        seeds, runs = list(args.seeds), []
        with tempfile.TemporaryDirectory() as tmp:
            for seed in seeds:
                runs.append(run(seed, Path(tmp) / f"seed{seed}"))
                if args.raw:
                    common.save_arrays(args.raw / f"seed{seed}.npz", runs[-1])
                print(seed, np.round(runs[-1]["accuracy"], 3).tolist(), f"{float(runs[-1]['minutes']):.1f} min",
                      flush=True)
    table = report(runs, seeds, args.out)
    common.write_text(args.out.with_suffix(".json"), json.dumps(
        {str(s): {k: np.asarray(v).tolist() for k, v in r.items()} for s, r in zip(seeds, runs)}))
    print(table)


if __name__ == "__main__":
    main()
