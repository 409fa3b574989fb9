"""Summarises the records tests/compile_report/sitecustomize.py wrote: CPU time of the pytest processes and of
the CLIs they started, the part of it spent tracing, lowering and compiling (per jitted function, per test
file), and the persistent cache's hits and misses.

usage: python tests/compile_report/report.py DIR [--top N]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

STAGES = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")


def is_pytest(argv: list[str]) -> bool:
    return any("pytest" in a or "xdist" in a or "execnet" in a for a in argv[:3]) or argv == ["-c"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    records = [json.loads(p.read_text()) for p in sorted(args.dir.glob("*.json"))]
    stage = collections.Counter()
    per_fun = collections.defaultdict(lambda: [0, 0.0])
    per_file = collections.defaultdict(collections.Counter)
    cache = collections.Counter()
    kinds = collections.defaultdict(lambda: [0, 0.0])
    for r in records:
        kind = "pytest and its xdist workers" if is_pytest(r["argv"]) else "other processes (the CLIs tests start)"
        kinds[kind][0] += 1
        kinds[kind][1] += r["cpu"]
        for test, event, fun, n, secs in r["events"]:
            stage[event] += secs
            if event == "backend_compile_duration":
                per_fun[fun][0] += n
                per_fun[fun][1] += secs
            per_file[test.split("::")[0] or "(outside a test)"][event] += secs
        for test, event, n in r["cache"]:
            cache[event] += n
    print(f"{len(records)} processes")
    for kind, (n, cpu) in kinds.items():
        print(f"  {kind}: {n}, {cpu / 60:.1f} CPU-min")
    print("compile stages (min): " + ", ".join(f"{k.replace('_duration', '')} {stage[k] / 60:.1f}" for k in STAGES)
          + f"; persistent cache: {cache['cache_hits']} hits, {cache['cache_misses']} misses, "
          f"{stage['compile_time_saved_sec'] / 60:.1f} min saved")
    print(f"\nbackend compile by jitted function (min, calls), top {args.top}")
    for fun, (n, secs) in sorted(per_fun.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{secs / 60:8.2f} {n:6d}  {fun}")
    print(f"\ntest files by trace + lower + compile (min): trace, lower, compile; top {args.top}")
    for name, c in sorted(per_file.items(), key=lambda kv: -sum(kv[1][s] for s in STAGES))[: args.top]:
        print(f"{c[STAGES[0]] / 60:6.2f} {c[STAGES[1]] / 60:6.2f} {c[STAGES[2]] / 60:6.2f}  {name}")


if __name__ == "__main__":
    main()
