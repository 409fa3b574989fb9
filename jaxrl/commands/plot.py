"""`jaxrl plot RUN_DIR [RUN_DIR...] [--out DIR]`: PNG curves of reward, accuracy, KL, entropy and length, and
each run's step time stacked by stage (`step_time.png`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (overlaid in each plot)"
    )
    parser.add_argument("--out", default=None, help="output directory (default: FIRST_RUN_DIR/plots)")


def run(args: argparse.Namespace) -> int:
    from jaxrl.runtime.plot import plot_runs

    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "plots"
    written = plot_runs(args.run_dirs, out)
    for path in written:
        print(path)
    if not written:
        print(f"no plottable metrics in {', '.join(args.run_dirs)}")
    return 0
