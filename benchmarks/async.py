"""Step time and exposed generation of asynchronous training (`train.async.max_staleness` k = 0, 1, 2).

    python benchmarks/async.py [--steps 8] [--repeats 2] [--out benchmarks/async.json] [--set key=value ...]
        [--devices N [--rollout-devices M]]

Runs `jaxrl train` (the embedded quickstart config, no warm start, one device; `--devices N`: N fake CPU
devices, `--rollout-devices M`: the first M of them the sampler's own, `mesh.rollout_devices`) for each k in
turn, round-robin `--repeats` times, and reads the metrics of every step after the first (which compiles). Per
k: the mean step
time, the collector's own time (generation + reward + env), the part of it the trainer waited for
(`time/exposed_generation`; for k = 0 all of it), the update, and the overlap achieved,
1 − exposed / collected. Prints a Markdown table; `--out` also writes the numbers as JSON.

What to expect on a 2-core CPU: the collection and the update share the same two cores, so the overlap hides
host work (Python decode loops, rewards) behind device work, not device work behind device work; the step
time falls by at most the smaller of the two. On an accelerator the same script shows how much of the
collection the host work is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ("sft_warmup.steps=0", "train.eval_every=0", "checkpoint.every=1000", "checkpoint.async_save=false",
        "logging.tensorboard=false", "logging.progress_bar=false", "logging.sample_every=1000")
COLLECTED = ("time/generation", "time/reward", "time/env")


def run(k: int, steps: int, extra: list[str], work: Path, devices: int | None = None) -> list[dict]:
    run_dir = Path(tempfile.mkdtemp(dir=work, prefix=f"k{k}-"))
    sets = [*BASE, f"train.steps={steps}", f"train.async.max_staleness={k}", *extra]
    argv = [sys.executable, "-m", "jaxrl.cli", "train", "--run-dir", str(run_dir),
            *[a for s in sets for a in ("--set", s)]]
    env = {key: v for key, v in os.environ.items() if key != "XLA_FLAGS"}  # one CPU device
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env.update(JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"k={k}: jaxrl train exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("step", 0) > 1 and "time/step" in r]


def summarise(rows: list[dict]) -> dict[str, float]:
    mean = lambda key: sum(r.get(key, 0.0) for r in rows) / len(rows)  # noqa: E731
    collected = sum(mean(key) for key in COLLECTED)
    exposed = mean("time/exposed_generation") if any("time/exposed_generation" in r for r in rows) else collected
    return {"step_s": mean("time/step"), "collected_s": collected, "exposed_s": exposed,
            "update_s": mean("time/update"), "overlap": 1.0 - exposed / collected if collected else 0.0,
            "staleness_max": max(r.get("async/staleness_max", 0.0) for r in rows), "steps": len(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--devices", type=int, default=None, help="fake CPU devices (default: one)")
    parser.add_argument("--rollout-devices", type=int, default=0, help="of them, the sampler's own")
    args = parser.parse_args()
    if args.rollout_devices:
        args.sets = [*args.sets, f"mesh.rollout_devices={args.rollout_devices}"]
    ks = [int(k) for k in args.ks.split(",")]
    rows: dict[int, list[dict]] = {k: [] for k in ks}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.repeats):  # round-robin: each k sees the same machine load
            for k in ks:
                rows[k] += run(k, args.steps, args.sets, Path(work), args.devices)
    table = {k: summarise(rs) for k, rs in rows.items()}
    base = table[ks[0]]["step_s"]
    print("| k | step (s) | collected (s) | exposed (s) | update (s) | overlap | step vs k=0 | staleness max |")
    print("|---|---|---|---|---|---|---|---|")
    for k, t in table.items():
        print(f"| {k} | {t['step_s']:.3f} | {t['collected_s']:.3f} | {t['exposed_s']:.3f} | {t['update_s']:.3f} | "
              f"{t['overlap']:.0%} | {base / t['step_s']:.2f}x | {t['staleness_max']:.0f} |")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
