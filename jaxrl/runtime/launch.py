"""Cloud TPU pod launch: pure builders of gcloud argv lists, and a small supervisor loop that runs them.

Flow of `jaxrl launch CONFIG --tpu NAME --zone ZONE --accelerator-type v5p-64`:

1. `git archive HEAD` -> `/tmp/jaxrl-<sha>.tar.gz` (the exact committed tree; uncommitted edits are not sent).
2. create the TPU VM (`tpu-vm create`, or `queued-resources create` with `--queued`) unless it is READY.
3. `tpu-vm scp` the tarball and the config to every worker; `tpu-vm ssh --worker=all` unpacks it into
   `~/jaxrl`, builds `~/jaxrl-venv` (Python 3.11 via uv) and installs jaxrl plus `jax[tpu]` at our pin.
4. start `python -m jaxrl.cli train` on all workers with nohup (log `~/jaxrl-run/train.log`, exit code
   `train.rc`); `jax.distributed` initialises itself from the TPU metadata (`jaxrl.runtime.distributed`).
5. stream worker 0's log until training ends. If the stream breaks and the VM is PREEMPTED (or gone), delete,
   re-create, re-install and restart: the trainer resumes from the last checkpoint in `--run-dir`, which
   must be on GCS (`gs://...`) to survive a re-created VM.

Everything that touches the outside world is an argv list built by a pure function, so tests check the exact
commands and `--dry-run` prints them. No Pathways, no Kubernetes.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
import time
from pathlib import PurePosixPath
from typing import Callable

from jaxrl.errors import EXIT_PREEMPTED, UserError

JAX_VERSION = "0.10.2"
UV_VERSION = "0.13.8"
PYTHON_VERSION = "3.11"
# Cloud TPU runtime images by generation (software versions page of Cloud TPU docs).
RUNTIME_VERSIONS: dict[str, str] = {
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
_ACCEL_RE = re.compile(r"^(v4|v5p|v5litepod|v5e|v6e)-(\d+)$")
REMOTE_SRC = "~/jaxrl"
REMOTE_VENV = "~/jaxrl-venv"
REMOTE_RUN = "~/jaxrl-run"
READY = "READY"
SSH_FAILED, KILLED = 255, 254
# States after which the VM will not come back by itself: delete and create again.
DEAD_STATES = ("PREEMPTED", "TERMINATED", "STOPPED", "FAILED", "SUSPENDED", "NOT_FOUND")

Argv = list[str]


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """Everything the gcloud commands depend on."""

    config: str
    tpu: str
    zone: str
    accelerator_type: str
    commit: str
    project: str | None = None
    spot: bool = False
    queued: bool = False
    runtime_version: str | None = None
    run_dir: str = f"{REMOTE_RUN}/run"

    def __post_init__(self):
        if not _ACCEL_RE.match(self.accelerator_type):
            raise UserError(
                f"--accelerator-type={self.accelerator_type!r}: expected GENERATION-SIZE with generation one "
                "of v4, v5p, v5litepod (v5e), v6e, e.g. v5p-64 or v5litepod-16"
            )
        if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", self.tpu):
            raise UserError(f"--tpu={self.tpu!r}: lowercase letters, digits and '-', starting with a letter")

    @property
    def gcloud_accelerator(self) -> str:
        """gcloud spells v5e as v5litepod."""
        gen, size = _ACCEL_RE.match(self.accelerator_type).groups()
        return f"{'v5litepod' if gen == 'v5e' else gen}-{size}"

    @property
    def runtime(self) -> str:
        return self.runtime_version or RUNTIME_VERSIONS[self.gcloud_accelerator.split("-")[0]]

    @property
    def tarball(self) -> str:
        return f"/tmp/jaxrl-{self.commit[:12]}.tar.gz"

    @property
    def config_name(self) -> str:
        return PurePosixPath(self.config).name


def _where(spec: LaunchSpec) -> Argv:
    return ["--zone", spec.zone] + (["--project", spec.project] if spec.project else [])


def _tpu_vm(spec: LaunchSpec, verb: str, *rest: str) -> Argv:
    return ["gcloud", "compute", "tpus", "tpu-vm", verb, *rest, *_where(spec)]


def _queued(spec: LaunchSpec, verb: str, *rest: str) -> Argv:
    return ["gcloud", "compute", "tpus", "queued-resources", verb, *rest, *_where(spec)]


def package_cmd(spec: LaunchSpec) -> Argv:
    return ["git", "archive", "--format=tar.gz", "-o", spec.tarball, spec.commit]


def create_cmd(spec: LaunchSpec) -> Argv:
    spot = ["--spot"] if spec.spot else []
    if spec.queued:
        return _queued(spec, "create", spec.tpu, "--node-id", spec.tpu, "--accelerator-type",
                       spec.gcloud_accelerator, "--runtime-version", spec.runtime, *spot)
    return _tpu_vm(spec, "create", spec.tpu, "--accelerator-type", spec.gcloud_accelerator,
                   "--version", spec.runtime, *spot)


def describe_cmd(spec: LaunchSpec) -> Argv:
    return _tpu_vm(spec, "describe", spec.tpu, "--format=value(state)")


def delete_cmd(spec: LaunchSpec) -> Argv:
    if spec.queued:
        return _queued(spec, "delete", spec.tpu, "--force", "--quiet")
    return _tpu_vm(spec, "delete", spec.tpu, "--quiet")


def ssh_cmd(spec: LaunchSpec, worker: str, command: str) -> Argv:
    return _tpu_vm(spec, "ssh", spec.tpu, f"--worker={worker}", f"--command={command}")


def copy_cmd(spec: LaunchSpec) -> Argv:
    return _tpu_vm(spec, "scp", spec.tarball, spec.config, f"{spec.tpu}:~/", "--worker=all")


def install_script(spec: LaunchSpec) -> str:
    """Unpack the commit and install it into a Python 3.11 venv (TPU images ship 3.10; uv fetches 3.11)."""
    tar = PurePosixPath(spec.tarball).name
    uv = "~/.local/bin/uv"
    return " && ".join([
        f"rm -rf {REMOTE_SRC}",
        f"mkdir -p {REMOTE_SRC} {REMOTE_RUN}",
        f"tar -xzf ~/{tar} -C {REMOTE_SRC}",
        f"cp ~/{shlex.quote(spec.config_name)} {REMOTE_RUN}/config.yaml",
        f"python3 -m pip install -q --user uv=={UV_VERSION}",
        f"{uv} venv -q --allow-existing --python {PYTHON_VERSION} {REMOTE_VENV}",
        f"{uv} pip install -q --python {REMOTE_VENV}/bin/python -e {REMOTE_SRC} 'jax[tpu]=={JAX_VERSION}'",
    ])


def install_cmd(spec: LaunchSpec) -> Argv:
    return ssh_cmd(spec, "all", install_script(spec))


# SIGTERM to the process group of train.pid (see `start_script`), then wait until the group is gone.
_STOP_GROUP = ("p=$(cat train.pid 2>/dev/null) && [ -n \"$p\" ] && kill -TERM -\"$p\" 2>/dev/null && "
               "while kill -0 -\"$p\" 2>/dev/null; do sleep 1; done")


def start_script(spec: LaunchSpec) -> str:
    """Starts training in the background. The user's `--run-dir` is quoted for the inner `sh -c` and the whole
    inner command again for the ssh shell, so `$(...)`, `;` or quotes in it stay literal on the workers; the
    `~` paths are ours and left unquoted so that the shell expands them. Only `nohup` goes to the background
    (braces): a bare `a && b && nohup c &` backgrounds the whole list, whose `kill $(cat train.pid)` then
    races with the `echo $! > train.pid` after it and can kill the new run itself. `setsid` makes the wrapper
    shell a process-group leader whose pid is train.pid, so stopping signals the whole group (the wrapper alone
    would die and orphan the trainer); the wrapper traps TERM/INT with a no-op (reset to default in the
    trainer by exec) so that it outlives the trainer and records its exit code (75 after a preemption)."""
    train = f"{REMOTE_VENV}/bin/python -m jaxrl.cli train {REMOTE_RUN}/config.yaml --run-dir "
    inner = f"trap : TERM INT; {train}{shlex.quote(spec.run_dir)}; echo $? > {REMOTE_RUN}/train.rc"
    return (
        # A relaunch on a live VM first stops the previous run (and waits for its checkpoint), so two trainers
        # never share the chips.
        f"cd {REMOTE_RUN} && ({_STOP_GROUP}; true) && rm -f train.rc && "
        f"{{ setsid nohup sh -c {shlex.quote(inner)} > {REMOTE_RUN}/train.log 2>&1 < /dev/null & "
        f"echo $! > {REMOTE_RUN}/train.pid; }}"
    )


def start_cmd(spec: LaunchSpec) -> Argv:
    return ssh_cmd(spec, "all", start_script(spec))


def stream_cmd(spec: LaunchSpec) -> Argv:
    """Follow worker 0's log until its training process exits; exit with training's exit code (254 if it died
    without writing one; ssh itself fails with 255)."""
    return ssh_cmd(
        spec, "0",
        f"tail --pid=$(cat {REMOTE_RUN}/train.pid) -n +1 -F {REMOTE_RUN}/train.log; "
        f"exit $(cat {REMOTE_RUN}/train.rc 2>/dev/null || echo {KILLED})",
    )


def stop_cmd(spec: LaunchSpec) -> Argv:
    """SIGTERM to the training process group on every worker (the trainer saves a checkpoint, then exits)."""
    return ssh_cmd(spec, "all", f"cd {REMOTE_RUN} && ({_STOP_GROUP}; true)")


def status_cmds(spec: LaunchSpec) -> list[Argv]:
    return [describe_cmd(spec), ssh_cmd(spec, "0", f"tail -n 20 {REMOTE_RUN}/train.log")]


def launch_cmds(spec: LaunchSpec) -> list[Argv]:
    """Every command of a fresh launch, in order (what `--dry-run` prints)."""
    return [package_cmd(spec), create_cmd(spec), copy_cmd(spec), install_cmd(spec), start_cmd(spec),
            stream_cmd(spec)]


Runner = Callable[[Argv], subprocess.CompletedProcess]


def _tpu_state(spec: LaunchSpec, run: Runner) -> str:
    r = run(describe_cmd(spec))
    if r.returncode != 0:
        return "NOT_FOUND"
    return (r.stdout or "").strip() or "UNKNOWN"


def _check(r: subprocess.CompletedProcess, what: str) -> None:
    if r.returncode != 0:
        raise UserError(f"{what} failed (exit {r.returncode}): {shlex.join(r.args)}")


def _wait_ready(spec: LaunchSpec, run: Runner, sleep, poll_s: float, log) -> str:
    """Create the TPU if it is missing or dead, then poll until READY; returns the last state seen."""
    state = _tpu_state(spec, run)
    if state in DEAD_STATES:
        if state != "NOT_FOUND":
            log(f"TPU {spec.tpu} is {state}: deleting it")
            _check(run(delete_cmd(spec)), "deleting the TPU")
        log(f"creating TPU {spec.tpu} ({spec.gcloud_accelerator}, {spec.runtime})")
        _check(run(create_cmd(spec)), "creating the TPU")
        state = _tpu_state(spec, run)
    while state != READY and state not in ("PREEMPTED", "FAILED"):
        log(f"TPU {spec.tpu} is {state}; waiting for READY")  # NOT_FOUND while a queued request waits
        sleep(poll_s)
        state = _tpu_state(spec, run)
    return state


def supervise(
    spec: LaunchSpec,
    run: Runner,
    *,
    sleep: Callable[[float], None] = time.sleep,
    max_restarts: int = 20,
    poll_s: float = 30.0,
    log: Callable[[str], None] = lambda m: print(f"jaxrl launch: {m}", file=sys.stderr),
) -> int:
    """Create (if needed), install, start and watch; re-create and restart after preemption.

    `run(argv)` runs one command (stdout captured for `describe`). Training that exits with
    `EXIT_PREEMPTED` (75: stopped by SIGTERM after saving a checkpoint) on a READY VM is started again and
    resumes; any other exit code ends the loop (0 = done). Returns training's exit code on worker 0, or 1
    after `max_restarts` lost connections / preemptions.
    """
    _check(run(package_cmd(spec)), "packaging the current commit")
    losses = 0
    while True:
        if _wait_ready(spec, run, sleep, poll_s, log) != READY:
            continue
        _check(run(copy_cmd(spec)), "copying jaxrl and the config")
        _check(run(install_cmd(spec)), "installing jaxrl on the workers")
        _check(run(start_cmd(spec)), "starting training")
        while True:
            rc = run(stream_cmd(spec)).returncode
            state = _tpu_state(spec, run)
            if state == READY and rc == EXIT_PREEMPTED:
                losses += 1
                if losses > max_restarts:
                    log(f"giving up after {max_restarts} lost connections or preemptions (exit {rc})")
                    return 1
                log(f"training was stopped by SIGTERM (exit {rc}, checkpoint saved): restarting it "
                    f"({losses}/{max_restarts})")
                _check(run(start_cmd(spec)), "restarting training")
                continue
            if state == READY and rc != SSH_FAILED:
                log(f"training on worker 0 exited with code {rc}")
                return rc
            losses += 1
            if losses > max_restarts:
                log(f"giving up after {max_restarts} lost connections or preemptions (TPU state {state})")
                return 1
            if state != READY:
                log(f"TPU {spec.tpu} is {state}: re-creating it and resuming ({losses}/{max_restarts})")
                break
            log(f"log stream dropped (ssh exit {rc}); reconnecting ({losses}/{max_restarts})")
            sleep(poll_s)
