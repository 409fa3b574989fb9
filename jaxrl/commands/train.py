"""`jaxrl train [CONFIG] [--set key=value]... [--run-dir DIR] [--overwrite-run]`: RL post-training from a YAML
config.

A fresh run never mixes with an earlier one: `checkpoint.resume: false` in a run directory that holds an
earlier run's checkpoints or metrics is refused (exit 2), and `--overwrite-run` moves that run aside to
`RUN.old-<timestamp>` first (`jaxrl.runtime.run_dir.start_fresh_run`; nothing is deleted). Before anything is
written, `jaxrl.runtime.run_checks.validate_train` checks the run directory (writable, tokenizer present, an existing
run resumable by this config); then the trainer holds the run directory's lock (`jaxrl.runtime.run_lock`) for the
whole run. Exit codes (`jaxrl.errors`): 0 finished; 2 a user error (one line);
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
    parser.add_argument("--profile", default=None, metavar="STEPS",
                        help="write a jax.profiler trace of these steps (FIRST:LAST, e.g. 3:5, or one step) into "
                             "RUN/profile (TensorBoard's profile plugin, Perfetto)")
    parser.add_argument("--run-dir", default=None,
                        help="run directory (default: runs/<config name>); a gs:// URL keeps the checkpoints "
                             "there (so a re-created TPU VM resumes) and the metrics in runs/<config name>")
    parser.add_argument("--overwrite-run", action="store_true",
                        help="start a fresh run: move an existing run in the run directory aside to "
                             "RUN.old-<timestamp> (never deleted)")
    from jaxrl.runtime import distributed

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
    from jaxrl.runtime import distributed, run_summary, step_time
    from jaxrl.config import load_config

    cfg = load_config(args.config, args.overrides)  # config errors exit 2 before anything heavy starts
    profile = step_time.parse_profile_steps(args.profile) if args.profile else None
    distributed.initialize_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import jax

    from jaxrl.runtime import preemption, run_checks, run_dir as run_dirs, run_lock

    name = Path(args.config).stem if args.config else "quickstart"
    local = Path("runs") / name
    remote = args.run_dir if args.run_dir and "://" in args.run_dir else None
    run_dir = local if remote or not args.run_dir else Path(args.run_dir)
    checkpoint_dir = f"{remote.rstrip('/')}/checkpoints" if remote else None
    if args.overwrite_run or not cfg.checkpoint.resume:  # a fresh run: never beside an earlier run's files
        run_dirs.check_writable_dir(run_dir, "run directory")
        moved = run_dirs.start_fresh_run(run_dir, checkpoint_dir, overwrite=args.overwrite_run,
                                         processes=jax.process_count())
        if moved is not None:
            logging.getLogger(__name__).warning("moved the earlier run in %s aside to %s", run_dir, moved)
    # Before anything in the run directory is written: writable, tokenizer present, resumable by this config.
    run_checks.validate_train(cfg, run_dir, checkpoint_dir)
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        with run_lock.hold(run_dir, primary=jax.process_index() == 0):
            from jaxrl.rl.loop import train

            last = train(cfg, run_dir, checkpoint_dir=checkpoint_dir, profile=profile)
    except _StoppedBeforeSteps as e:
        print(f"jaxrl train: stopped by {signal.Signals(e.signum).name} before any new step (nothing to "
              f"save); run the same command to resume (exit {exit_code(e.signum)})", file=sys.stderr)
        return exit_code(e.signum)
    finally:
        signal.signal(signal.SIGTERM, previous)
    where = remote or run_dir
    summary = run_summary.read(run_dir) if jax.process_index() == 0 else None
    if summary:  # steps, wall time by phase, held-out accuracy, checkpoint, export command
        print("\n".join(run_summary.lines(summary)))
    # The loop reports the signal that stopped it; `last_stop_signal` covers a loop that predates that key.
    signum = last["stopped_by_signal"] if "stopped_by_signal" in last else preemption.last_stop_signal()
    if signum is not None:
        print(f"jaxrl train: stopped by {signal.Signals(signum).name} after step {last.get('step')}; "
              f"checkpoint saved in {where}; run the same command to resume (exit {exit_code(signum)})",
              file=sys.stderr)
        return exit_code(signum)
    acc = last.get("eval/accuracy")
    print(f"jaxrl train: finished step {last.get('step')} in {where}"
          + (f"; held-out accuracy {acc:.3f}" if acc is not None else ""))
    return 0
