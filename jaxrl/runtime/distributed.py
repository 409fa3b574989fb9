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
A peer that dies *after* start-up: JAX's own heartbeat would abort the survivors from C++ with a page of
stack trace. `PeerWatch` (below) beats faster: every process writes a counter to the coordinator's key-value
store every `heartbeat_timeout_s / 5` s and reads everyone else's; a peer whose counter has not moved for
`heartbeat_timeout_s` (or a coordinator that stops answering) makes every survivor print one line,
"jaxrl: lost process I ...", and exit with code 4 (`EXIT_PEER_LOST`). JAX's heartbeat is set 30 s later, as
a backstop. A process that fails with an error marks itself failed, so its peers stop at once instead of
waiting in a collective; one that finishes marks itself done, so a slower peer does not mistake it for lost.
The default heartbeat is 100 s; `JAXRL_HEARTBEAT_TIMEOUT` (seconds) overrides it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
import traceback
from typing import Callable, Mapping

import jax

from jaxrl.errors import UserError

EXIT_PEERS_MISSING = 3
EXIT_PEER_LOST = 4
HEARTBEAT_ENV = "JAXRL_HEARTBEAT_TIMEOUT"
_PEER_DIR = "jaxrl/peer/"
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
    heartbeat_timeout_s: int | None = None,
    env: Mapping[str, str] | None = None,
) -> ClusterSpec | None:
    """Join the multi-process job (see the module docstring); returns the spec, or None when single-process.

    Must run before any JAX computation. If the peers have not all connected after `timeout_s` seconds the
    process prints one line naming the coordinator and the expected count, and exits with code 3. Once
    connected, a `PeerWatch` with `heartbeat_timeout_s` (default: `$JAXRL_HEARTBEAT_TIMEOUT` or 100) runs.
    """
    env_map = os.environ if env is None else env
    spec = resolve(coordinator, num_processes, process_id, env)
    if spec is None:
        return None
    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = _env_int(env_map, HEARTBEAT_ENV) or 100
    if heartbeat_timeout_s < 1:
        raise UserError(f"{HEARTBEAT_ENV}={heartbeat_timeout_s}: the heartbeat timeout must be >= 1 s")
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
            heartbeat_timeout_seconds=heartbeat_timeout_s + _JAX_TIMEOUT_MARGIN_S,
            shutdown_timeout_seconds=max(60, heartbeat_timeout_s),
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
    where = spec.coordinator or "the TPU pod coordinator"
    start_peer_watch(jax.process_index(), jax.process_count(), heartbeat_timeout_s, where)
    return spec


def is_primary() -> bool:
    """True on the process that writes metrics, logs and single-writer files (process 0)."""
    return jax.process_index() == 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The multi-host flags shared by every command that can run as N processes (`train`, `train-rm`)."""
    group = parser.add_argument_group("multi-host (jax.distributed)")
    group.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0's coordinator")
    group.add_argument("--num-processes", type=int, metavar="N", help="total number of processes")
    group.add_argument("--process-id", type=int, metavar="I", help="index of this process in [0, N)")
    group.add_argument("--init-timeout", type=float, default=300.0, metavar="S",
                       help="seconds to wait for every process to connect before exiting with code 3")


def initialize_from_args(args: argparse.Namespace) -> ClusterSpec | None:
    """`initialize` from the flags of `add_arguments`."""
    return initialize(args.coordinator, args.num_processes, args.process_id, timeout_s=args.init_timeout)


def peer_verdict(states: Mapping[int, str], seen: dict[int, tuple[str, float]], now: float, me: int,
                 timeout_s: float) -> str | None:
    """One check of the peers' key-value states; the line to print if the job must stop, else None.

    Args:
      states: process id -> its last written state: "beat:N" (alive, N counts up), "done" or "failed:MSG".
      seen: process id -> (state last seen, time it last changed); updated in place. Peers that have not
        written yet count from the time the watch started (their entry's initial time).
      now: current monotonic time; me: this process; timeout_s: the heartbeat timeout.
    """
    lost = []
    for pid in sorted(seen):
        value = states.get(pid, "")
        if value.startswith("failed:"):
            return f"jaxrl: process {pid} failed ({value[len('failed:'):]}); stopping process {me} too"
        if value == "done":
            continue
        if value != seen[pid][0]:
            seen[pid] = (value, now)
        elif now - seen[pid][1] > timeout_s:
            lost.append(pid)
    if not lost:
        return None
    which = ", ".join(map(str, lost))
    return (f"jaxrl: lost process {which}: no heartbeat for {timeout_s:g} s (killed, crashed or preempted); "
            f"stopping process {me} with exit code {EXIT_PEER_LOST}")


class PeerWatch:
    """The daemon thread of the module docstring: beats, watches the peers, stops this process if one is lost.

    `kv_set(key, value)` and `kv_dir(prefix) -> [(key, value)]` are the coordinator's key-value store
    (injectable for tests); `exit_fn(line)` prints the line and ends the process (default: `os._exit(4)`).
    """

    def __init__(self, me: int, count: int, timeout_s: float, coordinator: str, kv_set, kv_dir,
                 exit_fn: Callable[[str], None] | None = None):
        self.me, self.timeout_s, self.coordinator = me, float(timeout_s), coordinator
        self.period_s = min(1.0, self.timeout_s / 5)
        self._set, self._dir = kv_set, kv_dir
        self._exit = exit_fn or _exit_peer_lost
        start = time.monotonic()
        self._seen = {pid: ("", start) for pid in range(count) if pid != me}
        self._stop = threading.Event()
        self._beats = 0
        self._thread = threading.Thread(target=self._loop, name="jaxrl-peer-watch", daemon=True)

    def start(self) -> "PeerWatch":
        self._thread.start()
        return self

    def poll(self) -> str | None:
        """Beat once and check the peers; the stop line or None (raises if the store cannot be reached)."""
        self._beats += 1
        self._set(f"{_PEER_DIR}{self.me}", f"beat:{self._beats}")
        states = {int(k.rsplit("/", 1)[-1]): v for k, v in self._dir(_PEER_DIR)}
        return peer_verdict(states, self._seen, time.monotonic(), self.me, self.timeout_s)

    def _loop(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self.period_s):
            try:
                line = self.poll()
                last_ok = time.monotonic()
            except Exception as e:  # the coordinator (process 0) is gone or unreachable
                if self._stop.is_set():
                    return
                if self.me != 0 and time.monotonic() - last_ok > min(self.timeout_s, 5 * self.period_s):
                    first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
                    line = (f"jaxrl: lost process 0 (the coordinator at {self.coordinator}): it stopped "
                            f"answering ({first}); stopping process {self.me} with exit code "
                            f"{EXIT_PEER_LOST}")
                else:
                    continue
            if line is not None and not self._stop.is_set():
                self._exit(line)
                return

    def finish(self, state: str) -> None:
        """Stop watching and leave `state` ("done" or "failed:MSG") for the peers (best effort).

        The thread is joined first (up to `JOIN_S`), for two reasons: a beat it was writing must not land
        after `state` (a peer would then wait for beats that never come and call this process lost), and it
        must not be inside a call into the coordinator's C++ client when the interpreter exits (CPython ends
        a daemon thread that wakes during finalisation with a forced unwind, which through C++ frames
        aborts the process: "terminate called ... FATAL: exception not rethrown").
        """
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(JOIN_S)
        try:
            self._set(f"{_PEER_DIR}{self.me}", state)
        except Exception:  # the store is gone: the peers will find out by themselves
            pass


_watch: PeerWatch | None = None
# How long `PeerWatch.finish` waits for the thread's call in flight (one key-value round trip, normally ms).
JOIN_S = 10.0


def _exit_peer_lost(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(EXIT_PEER_LOST)


# Errors that a peer's death causes in this process's collectives: wait for the watch's verdict on them.
_TRANSPORT_ERRORS = ("gloo", "connection reset", "connection refused", "unavailable", "deadline exceeded",
                     "socket closed", "broken pipe")


def _await_verdict(watch: PeerWatch, text: str) -> None:
    """If `text` is a transport error (a peer probably died inside a collective), give the watch the
    heartbeat timeout to name the lost peer and end the process; return otherwise."""
    if any(s in text.lower() for s in _TRANSPORT_ERRORS):
        deadline = time.monotonic() + watch.timeout_s + 3 * watch.period_s
        while time.monotonic() < deadline and watch._thread.is_alive() and not watch._stop.is_set():
            time.sleep(0.1)


def _excepthook(exc_type, exc, tb) -> None:
    """Uncaught error in a multi-process job: tell the peers, never hang in JAX's shutdown barrier."""
    watch = _watch
    if watch is not None and not issubclass(exc_type, KeyboardInterrupt):
        _await_verdict(watch, str(exc))
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        watch.finish(f"failed:{exc_type.__name__} on process {watch.me}: {first}")
    traceback.print_exception(exc_type, exc, tb)
    sys.stderr.flush()
    os._exit(1)


def start_peer_watch(me: int, count: int, timeout_s: float, coordinator: str) -> PeerWatch | None:
    """Start the `PeerWatch` on JAX's distributed client (after `jax.distributed.initialize`)."""
    global _watch
    if count < 2:
        return None
    from jax._src import distributed as jax_distributed  # the client is not public API

    client = jax_distributed.global_state.client
    _watch = PeerWatch(me, count, timeout_s, coordinator,
                       kv_set=lambda k, v: client.key_value_set(k, v, allow_overwrite=True),
                       kv_dir=client.key_value_dir_get).start()
    sys.excepthook = _excepthook
    return _watch


def finish(ok: bool = True, message: str = "") -> None:
    """Tell the peers this process is done (`ok`) or failed with `message`; call before exiting normally."""
    if _watch is not None:
        if not ok:
            _await_verdict(_watch, message)  # a lost peer is named by the watch, not reported as our failure
        _watch.finish("done" if ok else f"failed:{message[:200]} on process {_watch.me}")
