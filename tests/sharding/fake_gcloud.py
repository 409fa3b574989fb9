"""A fake `gcloud` for tests/sharding/test_launch_e2e.py: the TPU VM's workers are local processes.

Not collected by pytest. State lives under $FAKE_GCLOUD_ROOT: `state` (the VM state), `w0`, `w1`, ... (each
worker's home directory). Handles what `jaxrl.runtime.launch` runs:

* `tpu-vm describe ... --format=value(state)`: prints the state (NOT_FOUND before `create`).
* `tpu-vm create`, `delete`: set the state.
* `tpu-vm scp FILES NAME:~/ --worker=all`: copies the files into every worker's home.
* `tpu-vm ssh NAME --worker=W --command=CMD`: runs CMD with bash in worker W's home (all: each in turn), with
  the environment a pod worker gets from JAX (here: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
  JAX_PROCESS_ID and $FAKE_DEVICES fake CPU devices). The install command cannot reach PyPI here: its `uv`
  steps are replaced by a venv whose python is this test's interpreter (jaxrl installed from the checkout).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(os.environ["FAKE_GCLOUD_ROOT"])
WORKERS = int(os.environ.get("FAKE_WORKERS", "2"))


def flag(args, name):
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)


def worker_env(i: int) -> dict:
    env = dict(os.environ, HOME=str(ROOT / f"w{i}"), JAX_COORDINATOR_ADDRESS=os.environ["FAKE_COORDINATOR"],
               JAX_NUM_PROCESSES=str(WORKERS), JAX_PROCESS_ID=str(i), JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={os.environ.get('FAKE_DEVICES', '2')}")
    return env


def install(command: str, i: int) -> str:
    steps = [s for s in command.split(" && ") if "uv" not in s]
    venv = ROOT / f"w{i}" / "jaxrl-venv" / "bin"
    shim = f"printf '#!/bin/sh\\nexec {sys.executable} \"$@\"\\n' > {venv}/python"  # keeps this venv
    return " && ".join(steps + [f"mkdir -p {venv}", shim, f"chmod +x {venv}/python"])


def main(argv) -> int:
    verb = argv[4]  # argv: script compute tpus tpu-vm VERB ...
    state = ROOT / "state"
    if verb == "describe":
        print(state.read_text() if state.exists() else "NOT_FOUND")
        return 0 if state.exists() else 1
    if verb == "create":
        for i in range(WORKERS):
            (ROOT / f"w{i}").mkdir(parents=True, exist_ok=True)
        state.write_text("READY")
        return 0
    if verb == "delete":
        state.unlink(missing_ok=True)
        return 0
    if verb == "scp":
        args = argv[5:]
        args = args[:next((k for k, a in enumerate(args) if a.startswith("--")), len(args))]
        files = [a for a in args if ":" not in a]  # the last positional is the NAME:~/ destination
        for i in range(WORKERS):
            for f in files:
                shutil.copy(f, ROOT / f"w{i}")
        return 0
    if verb == "ssh":
        which, command = flag(argv, "worker"), flag(argv, "command")
        rc = 0
        for i in range(WORKERS) if which == "all" else [int(which)]:
            cmd = install(command, i) if "uv venv" in command else command
            done = subprocess.run(["bash", "-c", cmd], env=worker_env(i), cwd=ROOT / f"w{i}")
            rc = max(rc, done.returncode)
        return rc
    print(f"fake gcloud: unsupported {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
