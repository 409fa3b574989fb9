"""`run.sh`'s driver: the sections of `sections.py` in child processes under one time budget, then
results.json, results.md (`report.py`) and suite.log (the tail of each child's output) in `--out`.

    python benchmarks/device/suite.py [--cpu-dry-run] [--out DIR] [--started EPOCH] [--budget-s S]

A job (one or more sections in one child process) gets at most its own cap and never more than what is left
of the budget, counted from `--started` (run.sh's start, so installing the wheels counts too); a job that
runs out is killed and its sections are reported as `timeout`. The results are rewritten after every job, so
what finished is kept whatever happens later. Exit code 1 when a required section is not `ok`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import markdown, summarize
from sections import MODES, Settings

HERE = Path(__file__).resolve().parent
LOG_TAIL_LINES = 60  # of each child's output, kept in suite.log
BUDGET_S = {"gpu": 465.0, "dry": 170.0}  # gpu: run.sh must end within 8 minutes


@dataclasses.dataclass(frozen=True)
class Job:
    tasks: tuple[str, ...]  # SECTION[:SHAPE], run one after the other in one child process
    cap_s: float  # the most seconds the job may take
    optional: bool = False  # runs only if its whole cap still fits in the budget; may fail
    torch: bool = False  # keeps JAX off the GPU (torch allocates it; JAX would preallocate most of it)


def jobs(mode: str, s: Settings) -> list[Job]:
    if mode == "dry":  # two children: the JAX sections, then transformers
        (shape,) = s.shapes
        return [Job(("device", f"decode_jaxrl:{shape}", f"update:{shape}", "train_cli"), 240),
                Job((f"decode_hf:{shape}",), 90, torch=True)]
    # One section per child, so that its peak memory is its own; the smaller shape's sections first. Caps from
    # the H100 run of 2026-11-26 (benchmarks/RESULTS.md): transformers' decode is launch-bound (both shapes have
    # 28 layers, ~60 s for 64 x 512 tokens) and its first child also pays torch's CUDA start-up.
    small, large = s.shapes
    return [Job(("device",), 60),
            Job((f"decode_jaxrl:{small}",), 120), Job((f"decode_hf:{small}",), 130, torch=True),
            Job((f"update:{small}",), 120), Job(("train_cli",), 150),
            Job((f"decode_jaxrl:{large}",), 120), Job((f"decode_hf:{large}",), 110, torch=True),
            Job((f"update:{large}",), 130),
            Job((f"decode_hf_static:{small}",), 120, optional=True, torch=True)]


def run_job(job: Job, mode: str, timeout: float, log) -> dict[str, dict]:
    """{task: its JSON} from one child process; a task that wrote nothing is a `timeout` or a `crash`."""
    env = dict(os.environ, JAX_PLATFORMS="cpu") if job.torch else dict(os.environ)
    with tempfile.TemporaryDirectory() as result_dir, tempfile.TemporaryFile("w+") as out:
        cmd = [sys.executable, str(HERE / "sections.py"), *job.tasks, "--mode", mode,
               "--result-dir", result_dir]
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout
                                ).returncode
            missing = dict(status="crash", error=f"the child exited with code {rc} before writing this")
        except subprocess.TimeoutExpired:
            missing = dict(status="timeout", error=f"killed after {timeout:.0f} s (the job's time guard)")
        wall = time.monotonic() - t0
        out.seek(0)
        lines = out.read().splitlines()
        log.write(f"===== {' '.join(job.tasks)}: {wall:.1f} s; last {LOG_TAIL_LINES} of {len(lines)} lines\n")
        log.write("\n".join(lines[-LOG_TAIL_LINES:]) + "\n")
        log.flush()
        results = {}
        for task in job.tasks:
            path = Path(result_dir) / f"{task.replace(':', '.')}.json"
            results[task] = json.loads(path.read_text()) if path.is_file() else dict(missing, wall_s=wall)
    return results


def write_results(out: Path, raw: dict[str, dict], mode: str, started: float) -> None:
    """(Re)writes results.json and results.md from the sections finished so far."""
    res = summarize(raw, mode, MODES[mode])
    res.update(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               wall_s=time.time() - started)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=float))
    (out / "results.md").write_text(markdown(res))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on CPU: the code, not the speed")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "out"))
    ap.add_argument("--started", type=float, default=None, help="epoch seconds the budget counts from")
    ap.add_argument("--budget-s", type=float, default=None, help=f"default: {BUDGET_S}")
    args = ap.parse_args(argv)
    mode = "dry" if args.cpu_dry_run else "gpu"
    started = time.time() if args.started is None else args.started
    deadline = started + (args.budget_s or BUDGET_S[mode]) - 5.0  # 5 s to write the results
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw: dict[str, dict] = {}
    optional: set[str] = set()
    with open(out / "suite.log", "w") as log:
        for job in jobs(mode, MODES[mode]):
            optional.update(job.tasks if job.optional else ())
            left = deadline - time.time()
            if left < (job.cap_s if job.optional else 20.0):
                print(f"[suite] skipped {' '.join(job.tasks)}: {left:.0f} s of the budget left", flush=True)
                raw.update({t: dict(status="skipped", error=f"{left:.0f} s of the budget left")
                            for t in job.tasks})
            else:
                for task, r in run_job(job, mode, min(job.cap_s, left), log).items():
                    raw[task] = r
                    error = f" ({r['error'][:300]})" if r["status"] != "ok" else ""
                    print(f"[suite] {task}: {r['status']} in {r.get('wall_s', 0):.1f} s{error}", flush=True)
            write_results(out, raw, mode, started)
    print((out / "results.md").read_text(), flush=True)
    bad = [t for t, r in raw.items() if r["status"] != "ok" and t not in optional]
    if bad:
        print(f"[suite] not ok: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
