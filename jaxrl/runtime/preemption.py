"""SIGTERM / SIGINT as a stop request that the training loop honours between steps, agreed across hosts."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)

_last_signal: int | None = None


def last_stop_signal() -> int | None:
    """The signal number that last asked a `PreemptionGuard` of this process to stop, or None."""
    return _last_signal


class PreemptionGuard:
    """Context manager: SIGTERM and SIGINT set a flag instead of killing the process (`should_stop()`).

    The loop calls `should_stop()` between steps; with several processes the flag is OR-ed across hosts so
    every host stops after the same step and joins the final (collective) checkpoint save. `signal` is the
    number of the signal that asked for the stop (None when none did, also after `request()`); `jaxrl train`
    turns it into its exit code (`jaxrl.errors.EXIT_PREEMPTED` for SIGTERM, `EXIT_INTERRUPTED` for SIGINT).
    A second SIGINT while the final checkpoint is written is ignored (the stop is already under way).
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)):
        self.signals = signals
        self.signal: int | None = None
        self._requested = threading.Event()
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame):
        global _last_signal
        del frame
        if self.signal is None:
            log.warning("received %s: saving a checkpoint after the current step, then stopping",
                        signal.Signals(signum).name)
        self.signal = self.signal or signum
        _last_signal = self.signal
        self._requested.set()

    def __enter__(self) -> "PreemptionGuard":
        global _last_signal
        _last_signal = None
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handler)
        else:
            log.warning("PreemptionGuard outside the main thread: SIGTERM and SIGINT keep their defaults")
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def request(self) -> None:
        """Asks for a stop as if SIGTERM had arrived (also used by the non-finite-loss guard)."""
        self._requested.set()

    def should_stop(self) -> bool:
        local = self._requested.is_set()
        if jax.process_count() == 1:
            return local
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.asarray([local]))))
