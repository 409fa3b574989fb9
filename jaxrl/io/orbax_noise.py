"""What orbax leaves behind when a save or a restore fails, reduced to the one line jaxrl prints itself.

A full disk (`disk_full`): orbax's background save threads log every array that failed to write, with its
traceback and tensorstore spec (hundreds of lines), and keep running after the first failed commit; a failed
restore leaves asyncio futures, tasks and closed-event-loop tracebacks that surface long after it. `Checkpointer`
(`jaxrl.io.checkpoint`) reports each case in one line; the filters here drop only those messages.
"""

from __future__ import annotations

import errno
import logging
import sys
import threading
import time
import warnings


_NO_SPACE = ("No space left on device", "Disk quota exceeded")
_DRAIN_S = 60.0


def drain_background_writers(timeout_s: float = _DRAIN_S) -> None:
    """Waits (at most `timeout_s` in all) for orbax's save threads that are still running after one of them failed.

    Orbax stops waiting at the first failed commit; the others (e.g. `write_metadata_after_commits`) keep going.
    Left running, they meet interpreter shutdown after jaxrl has exited with its one line, and print a traceback
    ("cannot schedule new futures after interpreter shutdown"): Python stops thread pools before it joins
    non-daemon threads.
    """
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread is threading.current_thread() or not type(thread).__module__.startswith("orbax."):
            continue
        thread.join(max(0.0, deadline - time.monotonic()))


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it was raised from) is a full disk or quota: an OSError with ENOSPC /
    EDQUOT, or tensorstore's RESOURCE_EXHAUSTED error that orbax re-raises as a ValueError naming it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(exc) for text in _NO_SPACE):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _DropDiskFullNoise(logging.Filter):
    """Orbax's background save threads log each array that failed to write (with its traceback and tensorstore
    spec, hundreds of lines); a full disk is reported once, by `Checkpointer`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        full = any(text in message for text in _NO_SPACE)
        return not (full or (record.exc_info is not None and disk_full(record.exc_info[1])))


_disk_full_filters_installed = False


def quiet_disk_full_noise() -> None:
    global _disk_full_filters_installed
    if not _disk_full_filters_installed:
        _disk_full_filters_installed = True
        for name in ("absl", "asyncio"):
            logging.getLogger(name).addFilter(_DropDiskFullNoise())


# asyncio's messages for an unretrieved exception of a plain future and of a task (orbax's per-array
# `async_deserialize` tasks): which one appears depends on what garbage collection reaches first
_RESTORE_NOISE = ("Future exception was never retrieved", "Task exception was never retrieved")
_noise_filters_installed = False


def _closed_loop_error(exc: BaseException | None) -> bool:
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


class _DropRestoreNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_RESTORE_NOISE)


def quiet_restore_noise() -> None:
    """Before the first orbax restore of a process, silences what a failed restore leaves behind (our one
    warning line says what happened).

    A failed restore leaves one asyncio future or task per array whose exception nobody retrieves; asyncio
    logs each ("Future exception was never retrieved" / "Task exception was never retrieved" + the whole
    tensorstore spec, 16-45 KB for a small model) when it is collected, tensorstore callbacks into the closed
    event loop print "Event loop is closed" tracebacks, and coroutines it made but never awaited warn at exit
    ("coroutine 'Store._get_array_metadatas' was never awaited"). Any of them can come from orbax's threads
    while the restore is still failing or long after it, so the filters are installed once, before the first
    attempt, and stay; only those messages are dropped.
    """
    global _noise_filters_installed
    if _noise_filters_installed:
        return
    _noise_filters_installed = True
    logging.getLogger("asyncio").addFilter(_DropRestoreNoise())
    warnings.filterwarnings("ignore", message=r"coroutine '[\w.<>]+' was never awaited",
                            category=RuntimeWarning)
    previous_hook, previous_thread_hook = sys.excepthook, threading.excepthook
    previous_unraisable = sys.unraisablehook

    def excepthook(exc_type, exc, tb):
        if not _closed_loop_error(exc):
            previous_hook(exc_type, exc, tb)

    def thread_hook(args):
        if not _closed_loop_error(args.exc_value):
            previous_thread_hook(args)

    def unraisable_hook(args):
        if not _closed_loop_error(args.exc_value):
            previous_unraisable(args)

    sys.excepthook, threading.excepthook, sys.unraisablehook = excepthook, thread_hook, unraisable_hook
