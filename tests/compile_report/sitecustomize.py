"""Where a test run's XLA compile time goes: every Python process started with this directory on PYTHONPATH
and `JAXRL_ACCOUNT_DIR` set (pytest, its xdist workers, each `jaxrl` CLI a test starts) writes one JSON record
at exit: its argv, wall and CPU seconds, JAX's compile events (tracing, lowering, backend compile, per jitted
function and per test, from `PYTEST_CURRENT_TEST`) and the persistent cache's hits and misses.

    JAXRL_ACCOUNT_DIR=/tmp/acct PYTHONPATH=tests/compile_report:$PWD make test PYTEST_ARGS="-p account_plugin tests/train"
    .venv/bin/python tests/compile_report/report.py /tmp/acct

(`account_plugin` writes the xdist workers' records at session end: they exit without running `atexit`.)
The listener is registered when `jax` is first imported, through an import hook, so a process that never
imports JAX pays nothing. Off unless `JAXRL_ACCOUNT_DIR` is set.
"""

from __future__ import annotations

import atexit
import collections
import importlib.abc
import importlib.machinery
import json
import os
import resource
import sys
import time

_DIR = os.environ.get("JAXRL_ACCOUNT_DIR")
_T0 = time.time()
_EVENTS: dict[tuple[str, str, str], list] = collections.defaultdict(lambda: [0, 0.0])  # (test, event, fun)
_CACHE: collections.Counter = collections.Counter()  # (test, cache_hits | cache_misses)
_written = False


def _test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]


def _listen() -> None:
    from jax._src import monitoring

    def duration(event: str, secs: float, **kw) -> None:
        if "compile" in event or "jaxpr" in event:
            slot = _EVENTS[(_test(), event.rsplit("/", 1)[-1], kw.get("fun_name", ""))]
            slot[0] += 1
            slot[1] += secs

    def count(event: str, **kw) -> None:
        if event.endswith(("cache_hits", "cache_misses")):
            _CACHE[(_test(), event.rsplit("/", 1)[-1])] += 1

    monitoring.register_event_duration_secs_listener(duration)
    monitoring.register_event_listener(count)


class _OnJaxImport(importlib.abc.MetaPathFinder):
    """Finds `jax` as usual and registers the listeners right after it has been imported."""

    def find_spec(self, name, path, target=None):
        if name != "jax":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_listen(module):
            exec_module(module)
            _listen()

        spec.loader.exec_module = exec_then_listen
        return spec


def write_record() -> None:
    """Writes this process's record once (atexit, or `account_plugin` at pytest's session end)."""
    global _written
    if _written or not _DIR:
        return
    _written = True
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {"argv": sys.argv[:12], "pid": os.getpid(), "wall": time.time() - _T0,
              "cpu": usage.ru_utime + usage.ru_stime,
              "events": [[*key, *value] for key, value in _EVENTS.items()],
              "cache": [[*key, n] for key, n in _CACHE.items()]}
    os.makedirs(_DIR, exist_ok=True)
    with open(os.path.join(_DIR, f"{os.getpid()}.{int(_T0 * 1000)}.json"), "w") as f:
        json.dump(record, f)


if _DIR:
    sys.meta_path.insert(0, _OnJaxImport())
    atexit.register(write_record)
