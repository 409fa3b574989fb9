"""`jaxrl launch CONFIG --tpu NAME --zone ZONE --accelerator-type v5p-64`: run a config on a Cloud TPU pod.

See `jaxrl.runtime.launch` for the flow. `--dry-run` prints every command and runs nothing (it reads the HEAD id).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from jaxrl.runtime import launch
from jaxrl.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment YAML (copied to every worker)")
    parser.add_argument("--tpu", required=True, help="TPU VM (node) name")
    parser.add_argument("--zone", required=True, help="e.g. us-east5-a")
    parser.add_argument("--accelerator-type", required=True, help="e.g. v5p-64, v5litepod-16, v6e-8, v4-32")
    parser.add_argument("--project", help="GCP project (default: gcloud's configured project)")
    cap = parser.add_mutually_exclusive_group()
    cap.add_argument("--spot", action="store_true", help="spot capacity (preemptible)")
    cap.add_argument("--queued", action="store_true", help="request the TPU as a queued resource")
    parser.add_argument("--runtime-version", help="TPU software version (default by generation)")
    parser.add_argument("--run-dir", default=f"{launch.REMOTE_RUN}/run",
                        help="run directory on the workers; use gs://BUCKET/PATH to resume after re-creation")
    parser.add_argument("--max-restarts", type=int, default=20, help="preemptions / lost streams tolerated")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    action.add_argument("--status", action="store_true", help="TPU state and the tail of worker 0's log")
    action.add_argument("--stop", action="store_true", help="stop training on all workers")
    action.add_argument("--delete", action="store_true", help="stop training and delete the TPU")


def _head_commit() -> str:
    r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError("jaxrl launch must run inside the jaxrl git checkout (it ships `git archive HEAD`)")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    if dirty:
        print("jaxrl launch: warning: uncommitted changes are NOT shipped; the workers get commit "
              f"{r.stdout.strip()[:12]}", file=sys.stderr)
    return r.stdout.strip()


def spec_from_args(args: argparse.Namespace, commit: str) -> launch.LaunchSpec:
    return launch.LaunchSpec(
        config=args.config, tpu=args.tpu, zone=args.zone, accelerator_type=args.accelerator_type,
        commit=commit, project=args.project, spot=args.spot, queued=args.queued,
        runtime_version=args.runtime_version, run_dir=args.run_dir,
    )


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    print("+ " + shlex.join(argv), file=sys.stderr, flush=True)
    capture = argv[4:5] == ["describe"]
    return subprocess.run(argv, capture_output=capture, text=True)


def run(args: argparse.Namespace) -> int:
    if not (args.status or args.stop or args.delete) and not Path(args.config).is_file():
        raise UserError(f"config file {args.config!r} does not exist")
    spec = spec_from_args(args, _head_commit())
    if args.dry_run:
        for argv in launch.launch_cmds(spec):
            print(shlex.join(argv))
        return 0
    if args.status:
        return max(_run(argv).returncode for argv in launch.status_cmds(spec))
    if args.stop or args.delete:
        rc = _run(launch.stop_cmd(spec)).returncode
        return _run(launch.delete_cmd(spec)).returncode if args.delete else rc
    if not args.run_dir.startswith("gs://"):
        print(f"jaxrl launch: warning: --run-dir {args.run_dir} is on the VM's disk; after a preemption the "
              "re-created VM starts from scratch. Use gs://BUCKET/PATH to resume.", file=sys.stderr)
    return launch.supervise(spec, _run, max_restarts=args.max_restarts)
