"""`jaxrl train-rm [CONFIG] [--set k=v]... [--run-dir DIR]`: Bradley-Terry reward model, optionally
DIR-debiased.

Without CONFIG the embedded `configs/rm_length_bt.yaml` is used. Config errors (unknown key, bad value)
exit 2. Like `jaxrl train`, it holds the run directory's lock (`jaxrl.runtime.run_lock`) for the whole run: a second
trainer on the same directory exits 2 naming the holder.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="RM experiment YAML (default: embedded rm_length_bt.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--run-dir", default="runs/rm", help="run directory (metrics, checkpoints, eval)")
    from jaxrl.runtime import distributed

    distributed.add_arguments(parser)  # N processes: data-parallel over every device (`jaxrl.reward_model.run`)


def run(args: argparse.Namespace) -> int:
    from jaxrl.reward_model.config import load_rm_config

    from jaxrl.runtime import distributed

    cfg = load_rm_config(args.config, args.set)
    distributed.initialize_from_args(args)
    import jax

    from jaxrl.runtime import run_lock
    from jaxrl.reward_model.run import train_rm

    with run_lock.hold(args.run_dir, primary=jax.process_index() == 0):
        report = train_rm(cfg, args.run_dir)
    if jax.process_index() != 0:
        return 0
    attr = cfg.debias.attribute
    stats = report["attributes"][attr]
    print(json.dumps({"accuracy": report["accuracy"], f"{attr}_correlation": stats["correlation"],
                      f"{attr}_mi_nats": report["attributes"][attr]["mi_nats"]}))
    return 0
