"""`jaxrl train [CONFIG] [--set key=value]... [--run-dir DIR]`: RL post-training from a YAML config.

Before anything is written, `jaxrl.run_checks.validate_train` checks the run directory (writable, tokenizer
present, an existing run resumable by this config); then the trainer holds the run directory's lock
(`jaxrl.run_lock`) for the whole run. Exit codes (`jaxrl.errors`): 0 finished; 2 a user error (one line);
75 stopped by SIGTERM and 130 stopped by SIGINT, in both cases after saving a checkpoint when training steps
had started, so the same command resumes (`jaxrl launch` restarts on 75).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=None,
                        help="YAML config (default: the embedded configs/quickstart.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value by its dotted key, e.g. --set optimizer.lr=1e-5")
    parser.add_argument("--run-dir", default=None,
                        help="run directory (default: runs/<config name>); a gs:// URL keeps the checkpoints "
                             "there (so a re-created TPU VM resumes) and the metrics in runs/<config name>")
    from jaxrl import distributed

    distributed.add_arguments(parser)


class _StoppedBeforeSteps(BaseException):
    """SIGTERM before the training loop's own handler is installed (setup, compile, SFT warm start)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_on_sigterm(signum, frame):
    del frame
    raise _StoppedBeforeSteps(signum)


def exit_code(signum: int | None) -> int:
    """0 when training ran to the end; `EXIT_PREEMPTED` (75) after SIGTERM, `EXIT_INTERRUPTED` (130) after
    SIGINT (both after a checkpoint was saved, so the same command resumes)."""
    from jaxrl.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED

    if signum is None:
        return EXIT_OK
    return EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED


def run(args: argparse.Namespace) -> int:
    from jaxrl import distributed
    from jaxrl.config import load_config

    cfg = load_config(args.config, args.overrides)  # config errors exit 2 before anything heavy starts
    distributed.initialize_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import jax

    from jaxrl import checkpoint, run_checks, run_lock

    name = Path(args.config).stem if args.config else "quickstart"
    local = Path("runs") / name
    remote = args.run_dir if args.run_dir and "://" in args.run_dir else None
    run_dir = local if remote or not args.run_dir else Path(args.run_dir)
    checkpoint_dir = f"{remote.rstrip('/')}/checkpoints" if remote else None
    # Before anything in the run directory is written: writable, tokenizer present, resumable by this config.
    run_checks.validate_train(cfg, run_dir, checkpoint_dir)
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        with run_lock.hold(run_dir, primary=jax.process_index() == 0):
            from jaxrl.train_loop import train

            last = train(cfg, run_dir, checkpoint_dir=checkpoint_dir)
    except _StoppedBeforeSteps as e:
        print(f"jaxrl train: stopped by {signal.Signals(e.signum).name} before any new step (nothing to "
              f"save); run the same command to resume (exit {exit_code(e.signum)})", file=sys.stderr)
        return exit_code(e.signum)
    finally:
        signal.signal(signal.SIGTERM, previous)
    where = remote or run_dir
    # The loop reports the signal that stopped it; `last_stop_signal` covers a loop that predates that key.
    signum = last["stopped_by_signal"] if "stopped_by_signal" in last else checkpoint.last_stop_signal()
    if signum is not None:
        print(f"jaxrl train: stopped by {signal.Signals(signum).name} after step {last.get('step')}; "
              f"checkpoint saved in {where}; run the same command to resume (exit {exit_code(signum)})",
              file=sys.stderr)
        return exit_code(signum)
    acc = last.get("eval/accuracy")
    print(f"jaxrl train: finished step {last.get('step')} in {where}"
          + (f"; held-out accuracy {acc:.3f}" if acc is not None else ""))
    return 0
