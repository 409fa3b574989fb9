"""`jaxrl train [CONFIG] [--set key=value]... [--run-dir DIR]`: RL post-training from a YAML config."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=None,
                        help="YAML config (default: the embedded configs/quickstart.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value by its dotted key, e.g. --set optimizer.lr=1e-5")
    parser.add_argument("--run-dir", default=None,
                        help="run directory (default: runs/<config name>); a gs:// URL keeps the checkpoints "
                             "there (so a re-created TPU VM resumes) and the metrics in runs/<config name>")
    parser.add_argument("--coordinator", default=None, help="multi-host: coordinator HOST:PORT")
    parser.add_argument("--num-processes", type=int, default=None, help="multi-host: number of processes")
    parser.add_argument("--process-id", type=int, default=None, help="multi-host: this process's index")
    parser.add_argument("--init-timeout", type=int, default=300,
                        help="multi-host: seconds to wait for all processes before exiting with an error")


def run(args: argparse.Namespace) -> int:
    from jaxrl import distributed
    from jaxrl.config import load_config

    cfg = load_config(args.config, args.overrides)  # config errors exit 2 before anything heavy starts
    distributed.initialize(coordinator=args.coordinator, num_processes=args.num_processes,
                           process_id=args.process_id, timeout_s=args.init_timeout)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from jaxrl.train_loop import train

    name = Path(args.config).stem if args.config else "quickstart"
    local = Path("runs") / name
    remote = args.run_dir if args.run_dir and "://" in args.run_dir else None
    run_dir = local if remote or not args.run_dir else Path(args.run_dir)
    last = train(cfg, run_dir, checkpoint_dir=f"{remote.rstrip('/')}/checkpoints" if remote else None)
    acc = last.get("eval/accuracy")
    print(f"jaxrl train: finished step {last.get('step')} in {remote or run_dir}"
          + (f"; held-out accuracy {acc:.3f}" if acc is not None else ""))
    return 0
