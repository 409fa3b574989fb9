"""One trainer per run directory: an exclusive `fcntl.flock` on `RUN/.jaxrl-train.lock`.

The lock file holds one JSON line naming the holder (`{"pid", "host", "started"}`). The operating system drops
a flock when its process dies, however it dies (kill -9 included), so a file that still names a holder but is
not locked was left by a killed trainer: it is stale, and the next trainer takes it over with a warning. A
live holder makes a second trainer fail with `RunDirError` (exit 2) naming the pid, host and start time. The
file is emptied on a clean release and never deleted (deleting it would let two processes lock different
inodes).

flock is per host on most network filesystems; with a run directory shared between machines only the primary
process (`jax.process_index() == 0`) takes the lock, so hosts of one job never contend.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from jaxrl.errors import RunDirError

log = logging.getLogger(__name__)

LOCK_FILE = ".jaxrl-train.lock"


def _holder_text(info: dict) -> str:
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) \
        else "an unknown time"
    return f"pid {info.get('pid', '?')} on host {info.get('host', '?')} since {when}"


def _read(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        info = json.loads(text)
    except json.JSONDecodeError:
        return {"pid": "?", "host": "?", "raw": text[:80]}
    return info if isinstance(info, dict) else {"raw": text[:80]}


class RunLock:
    """Exclusive lock on a run directory (see the module docstring); `acquire` / `release` or `with`."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        self._created = False  # this lock made the run directory: release removes it if nothing else was written

    def acquire(self) -> "RunLock":
        try:
            self._created = not self.run_dir.exists()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(f"run directory {self.run_dir}: cannot create the lock file {self.path}: "
                              f"{e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _read(fd) or {}
            os.close(fd)
            raise RunDirError(f"run directory {self.run_dir} is in use by another trainer "
                              f"({_holder_text(info)}); wait for it to finish, stop it, or use another "
                              "--run-dir") from None
        stale = _read(fd)
        if stale is not None:
            log.warning("run directory %s: taking over a stale lock left by %s (that process is gone)",
                        self.run_dir, _holder_text(stale))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)  # empty = released cleanly (a non-empty unlocked file is stale)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        if self._created:  # a command that failed before writing anything leaves no directory behind
            with contextlib.suppress(OSError):
                if [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
                    self.path.unlink()
                    self.run_dir.rmdir()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def hold(run_dir: str | os.PathLike, *, primary: bool = True) -> Iterator[RunLock | None]:
    """Holds the run directory's lock for the `with` block; a no-op on non-primary processes."""
    if not primary:
        yield None
        return
    with RunLock(run_dir) as lock:
        yield lock
