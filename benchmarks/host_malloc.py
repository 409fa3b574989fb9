"""Peak RSS and step time of short `jaxrl train` runs under each `JAXRL_HOST_MALLOC` mode
(jaxrl/runtime/host_memory.py).

    .venv/bin/python benchmarks/host_malloc.py [CONFIG] [--steps 2] [--rounds 1] [--modes keep,default]
        [--set KEY=VALUE ...]

Each run is the `jaxrl` CLI in its own process (the same code path as a user's run, checkpoints and evaluation
off), the modes taking turns round-robin so that a CPU shared with other work slows each alike. Peak RSS is the
child's `ru_maxrss` from wait4(2); step times (rollout, update) come from the run's metrics.jsonl: the first
step includes compilation, the last one does not. On a host without accelerators `auto` is `keep`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(config: str, mode: str, steps: int, overrides: list[str], workdir: Path) -> dict:
    run_dir = workdir / f"run-{mode}"
    sets = [f"train.steps={steps}", "train.eval_every=0", f"checkpoint.every={steps + 1}",
            "logging.progress_bar=false", "logging.tensorboard=false", *overrides]
    cmd = [str(Path(sys.executable).parent / "jaxrl"), "train", config, "--run-dir", str(run_dir)]
    cmd += [a for s in sets for a in ("--set", s)]
    env = dict(os.environ, JAXRL_HOST_MALLOC=mode)
    env.pop("XLA_FLAGS", None)
    with open(workdir / f"log-{mode}.txt", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        tail = (workdir / f"log-{mode}.txt").read_text()[-3000:]
        raise RuntimeError(f"{mode}: jaxrl train failed:\n{tail}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["step"] > 0]
    stages = ("generation", "reward", "env", "old_logprobs", "ref_logprobs", "update", "weight_sync")
    step_s = [sum(r[f"time/{k}"] for k in stages) for r in rows]  # the step's stages (`jaxrl.runtime.step_time`)
    rollout_s = [r["time/generation"] + r["time/reward"] + r["time/env"] for r in rows]
    return dict(mode=mode, peak_rss_gib=usage.ru_maxrss / 2**20, step_s=step_s,
                update_s=[r["time/update"] for r in rows], rollout_s=rollout_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="configs/smollm2_arithmetic.yaml")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default="keep,default")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in args.modes.split(","):
                work = Path(tmp) / f"round{r}"
                work.mkdir(exist_ok=True)
                res = run_once(args.config, mode, args.steps, args.set, work)
                results.setdefault(mode, []).append(res)
                print(json.dumps(res), flush=True)
    print(f"{args.config}, {args.steps} steps, overrides {args.set}, {args.rounds} round(s):")
    for mode, runs in results.items():
        peak = max(x["peak_rss_gib"] for x in runs)
        last = min(x["step_s"][-1] for x in runs)
        first = min(x["step_s"][0] for x in runs)
        print(f"  JAXRL_HOST_MALLOC={mode:8s} peak RSS {peak:6.2f} GiB  first step {first:6.1f} s  "
              f"last step {last:6.1f} s (update {min(x['update_s'][-1] for x in runs):.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
