"""Multi-host start-up: `jax.distributed.initialize` with a clear message and a watchdog instead of a hang.

Three ways to find the other processes, in this order:

1. explicit arguments (`jaxrl train --coordinator HOST:PORT --num-processes N --process-id I`);
2. the standard environment variables `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`
   (explicit arguments win field by field);
3. a Cloud TPU pod VM (`TPU_WORKER_HOSTNAMES` lists more than one host, or `MEGASCALE_COORDINATOR_ADDRESS` is
   set for multi-slice): `jax.distributed.initialize()` with no arguments, which asks the TPU metadata.

Otherwise the run is single-process and nothing is initialised.

Why a watchdog: when a peer never connects, JAX hard-aborts the process from C++ after its own timeout
(SIGABRT, "Terminating process because the JAX distributed service detected fatal errors"), which says nothing
about who was expected where. We print what we wait for before connecting, give JAX a slightly longer timeout,
and a daemon timer prints "peer processes did not connect ..." and exits with code 3 at `timeout_s`.
A peer that dies *after* start-up is detected by JAX's heartbeat (`heartbeat_timeout_s`), which aborts the
survivors; the start-up message names that timeout too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
from typing import Mapping

import jax

from jaxrl.errors import UserError

EXIT_PEERS_MISSING = 3
# JAX's own abort must come after our watchdog, so that the clear message wins the race.
_JAX_TIMEOUT_MARGIN_S = 30


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """Where this process sits: `auto` (TPU pod metadata) or explicit coordinator/num_processes/process_id."""

    auto: bool
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def describe(self) -> str:
        if self.auto:
            return "the TPU pod's processes (auto-detected from the TPU VM metadata)"
        return f"{self.num_processes} processes at {self.coordinator}"


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} must be an integer") from None


def _on_tpu_pod(env: Mapping[str, str]) -> bool:
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    return len(hosts) > 1 or bool(env.get("MEGASCALE_COORDINATOR_ADDRESS"))


def resolve(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    env: Mapping[str, str] | None = None,
) -> ClusterSpec | None:
    """The cluster this process belongs to, or None for a single-process run. Pure apart from `env`."""
    env = os.environ if env is None else env
    coordinator = coordinator or env.get("JAX_COORDINATOR_ADDRESS") or None
    num_processes = num_processes if num_processes is not None else _env_int(env, "JAX_NUM_PROCESSES")
    process_id = process_id if process_id is not None else _env_int(env, "JAX_PROCESS_ID")
    given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    if all(v is None for v in given.values()):
        return ClusterSpec(auto=True) if _on_tpu_pod(env) else None
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise UserError(
            f"multi-process run needs --coordinator HOST:PORT, --num-processes N and --process-id I "
            f"(or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); missing {', '.join(missing)}"
        )
    host, sep, port = coordinator.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"--coordinator={coordinator!r}: expected HOST:PORT, e.g. 10.0.0.2:1234")
    if num_processes < 1:
        raise UserError(f"--num-processes={num_processes}: must be >= 1")
    if not 0 <= process_id < num_processes:
        raise UserError(f"--process-id={process_id}: must be in [0, {num_processes}) for {num_processes} "
                        "processes")
    if num_processes == 1:
        return None
    return ClusterSpec(False, coordinator, num_processes, process_id)


def _abort_missing_peers(spec: ClusterSpec, timeout_s: float) -> None:
    where = spec.coordinator if not spec.auto else "the TPU pod coordinator"
    expected = spec.num_processes if not spec.auto else "all pod"
    sys.stderr.write(
        f"jaxrl: peer processes did not connect to {where} within {timeout_s:g} s "
        f"(expected {expected} processes); check that every worker was started with the same coordinator "
        "and that the port is reachable\n"
    )
    sys.stderr.flush()
    os._exit(EXIT_PEERS_MISSING)


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: float = 300.0,
    *,
    heartbeat_timeout_s: int = 100,
    env: Mapping[str, str] | None = None,
) -> ClusterSpec | None:
    """Join the multi-process job (see the module docstring); returns the spec, or None when single-process.

    Must run before any JAX computation. If the peers have not all connected after `timeout_s` seconds the
    process prints one line naming the coordinator and the expected count, and exits with code 3.
    """
    spec = resolve(coordinator, num_processes, process_id, env)
    if spec is None:
        return None
    who = "this process" if spec.auto else f"process {spec.process_id}"
    sys.stderr.write(
        f"jaxrl: {who} waiting up to {timeout_s:g} s for {spec.describe()} "
        f"(a peer lost later aborts the job after {heartbeat_timeout_s} s without heartbeat)\n"
    )
    sys.stderr.flush()
    watchdog = threading.Timer(timeout_s, _abort_missing_peers, args=(spec, timeout_s))
    watchdog.daemon = True
    watchdog.start()
    try:
        kwargs = dict(
            initialization_timeout=int(timeout_s) + _JAX_TIMEOUT_MARGIN_S,
            heartbeat_timeout_seconds=heartbeat_timeout_s,
        )
        if spec.auto:
            jax.distributed.initialize(**kwargs)
        else:
            jax.distributed.initialize(
                coordinator_address=spec.coordinator,
                num_processes=spec.num_processes,
                process_id=spec.process_id,
                **kwargs,
            )
    finally:
        watchdog.cancel()
    return spec


def is_primary() -> bool:
    """True on the process that writes metrics, logs and single-writer files (process 0)."""
    return jax.process_index() == 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The multi-host flags shared by `jaxrl train` (and anything else that may run on a pod)."""
    group = parser.add_argument_group("multi-host (jax.distributed)")
    group.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0's coordinator")
    group.add_argument("--num-processes", type=int, metavar="N", help="total number of processes")
    group.add_argument("--process-id", type=int, metavar="I", help="index of this process in [0, N)")
    group.add_argument("--distributed-timeout", type=float, default=300.0, metavar="S",
                       help="seconds to wait for every process to connect before exiting with code 3")


def initialize_from_args(args: argparse.Namespace) -> ClusterSpec | None:
    """`initialize` from the flags of `add_arguments`."""
    return initialize(
        args.coordinator, args.num_processes, args.process_id, timeout_s=args.distributed_timeout
    )
