"""Progress lines for phases that can run long (issue 31 item 4): evaluation, HF import and export.

A phase that ends within `every_s` seconds logs nothing here (its caller logs one line for the whole phase);
a longer one logs `what: done/total unit (elapsed s)` at most once every `every_s` seconds, and one closing
line, so a log written without a terminal shows that the run is alive and how far the phase is, never
progress-bar frames. The SFT warm start and reward-model training log through their own step lines
(`jaxrl.rl.loop`, `jaxrl.runtime.metrics`).

    for batch in tracked(batches, "evaluation", unit="batches"):
        ...
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sized
from typing import TypeVar

T = TypeVar("T")
EVERY_S = 10.0

_log = logging.getLogger("jaxrl.runtime.progress")
_now = time.monotonic  # the clock; tests replace it


class Progress:
    """Counts the units of one phase and logs a line when `every_s` seconds passed since the last one."""

    def __init__(self, what: str, total: int | None, unit: str, *, every_s: float = EVERY_S,
                 log: logging.Logger = _log):
        self.what, self.total, self.unit, self.every_s, self.log = what, total, unit, every_s, log
        self.count = 0
        self.lines = 0
        self.start = self._last = _now()

    def _counted(self) -> str:
        of = f"/{self.total}" if self.total is not None else ""
        return f"{self.count}{of} {self.unit}"

    def advance(self, n: int = 1) -> None:
        self.count += n
        now = _now()
        if now - self._last >= self.every_s:
            self.log.info("%s: %s (%.0f s)", self.what, self._counted(), now - self.start)
            self._last = now
            self.lines += 1

    def finish(self) -> None:
        """The closing line, only for a phase that logged progress (a short phase stays silent)."""
        if self.lines:
            self.log.info("%s: done, %s in %.1f s", self.what, self._counted(), _now() - self.start)


def tracked(items: Iterable[T], what: str, *, unit: str, total: int | None = None,
            every_s: float = EVERY_S, log: logging.Logger = _log) -> Iterator[T]:
    """`items`, logging the phase's progress (one unit per item) as `Progress` does."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    progress = Progress(what, total, unit, every_s=every_s, log=log)
    for item in items:
        yield item
        progress.advance()
    progress.finish()
