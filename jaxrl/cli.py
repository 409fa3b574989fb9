"""The `jaxrl` command line: parse arguments and hand over to one subcommand module.

Each subcommand lives in `jaxrl/commands/<name>.py` and exposes `add_arguments(parser)` and
`run(args) -> int`.
Modules are imported only when their subcommand runs, so `jaxrl --help` stays fast and a subcommand's heavy
dependencies (torch for export checks, gcloud for launch) are never touched by another.

User errors raise `jaxrl.errors.UserError`; they are printed as one line on stderr and exit with code 2, as
are filesystem errors (`FILESYSTEM_ERRNOS`); Ctrl-C outside a training loop prints one line and exits 130
(exit codes: `jaxrl.errors`).
Before anything imports jax, `jaxrl.runtime.host_memory.configure_from_env()` sets the host allocator up for XLA:CPU.
Third-party warnings that are false for jaxrl are dropped before any subcommand imports their library
(`FALSE_WARNINGS`).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import logging
import os
import sys

from jaxrl.runtime import host_memory
from jaxrl.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, UserError

# Filesystem errors at the edges (a run dir that is a file, unwritable, full disk, ...) are the user's to fix:
# one line, exit 2. Other OSErrors (network, bugs) keep their traceback.
FILESYSTEM_ERRNOS = frozenset({errno.ENOENT, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES,
                               errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG,
                               errno.ENOTEMPTY})

# name -> (module, one-line help). Explicit and greppable; no registry.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("jaxrl.commands.train", "RL post-training from a YAML config"),
    "sample": ("jaxrl.commands.sample", "sample completions from a checkpoint or HF directory"),
    "eval": ("jaxrl.commands.eval", "score a checkpoint on a dataset: accuracy, avg@k, pass@k"),
    "import-hf": ("jaxrl.commands.import_hf", "convert a Hugging Face directory to a jaxrl checkpoint"),
    "export-hf": ("jaxrl.commands.export_hf", "convert a jaxrl checkpoint to a Hugging Face directory"),
    "plot": ("jaxrl.commands.plot", "plot metrics of one or more run directories"),
    "plan": ("jaxrl.commands.plan", "per-device memory plan of a config on a device mesh"),
    "launch": ("jaxrl.commands.launch", "launch a config on a Cloud TPU pod"),
    "train-rm": ("jaxrl.commands.train_rm", "train a Bradley-Terry reward model (optionally DIR-debiased)"),
    "eval-rm": ("jaxrl.commands.eval_rm", "evaluate a reward model: accuracy and bias statistics"),
}


# logger -> start of a message that is false for jaxrl. transformers (5.x) logs "PyTorch was not found. Models
# won't be available ..." at import on a core-only install: jaxrl's models are JAX, and transformers only
# gives it tokenizers and configs.
FALSE_WARNINGS: dict[str, tuple[str, ...]] = {"transformers": ("PyTorch was not found",)}


def _drop_false_warnings() -> None:
    for name, starts in FALSE_WARNINGS.items():
        logging.getLogger(name).addFilter(lambda record, s=starts: not record.getMessage().startswith(s))


def _set_offline_defaults() -> None:
    # Fail fast instead of hanging on hub retries; users who want the hub unset these explicitly.
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")


def main(argv: list[str] | None = None) -> int:
    _set_offline_defaults()
    _drop_false_warnings()
    try:
        host_memory.configure_from_env()  # before any subcommand imports jax (see jaxrl.runtime.host_memory)
    except ValueError as e:
        print(f"jaxrl: error: {e}", file=sys.stderr)
        return 2
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="jaxrl")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = argv[0] if argv else None
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        if name == chosen:
            importlib.import_module(module_name).add_arguments(p)
    args = parser.parse_args(argv)
    remote = next((v for v in vars(args).values() if isinstance(v, str) and v.startswith("gs://")), None)
    if remote and args.command != "launch" and importlib.util.find_spec("gcsfs") is None:  # launch: remote
        print(f"jaxrl {args.command}: error: {remote}: gs:// paths need gcsfs; pip install 'jaxrl[gcs]'",
              file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except UserError as e:
        print(f"jaxrl {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"jaxrl {args.command}: interrupted (SIGINT)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:
        if e.errno not in FILESYSTEM_ERRNOS:
            raise
        where = f": {e.filename}" if e.filename else ""
        print(f"jaxrl {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
