"""One trainer per run directory (`jaxrl.runtime.run_lock`): a second one exits 2 naming the holder; a lock left by a
killed process is stale and taken over with a warning; a clean release empties the file."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys

import pytest

from jaxrl.errors import RunDirError
from jaxrl.runtime.run_lock import LOCK_FILE, RunLock
from tests.runtime import _trainer as T


def test_second_holder_is_refused_naming_the_first(tmp_path):
    (tmp_path / "run").mkdir()  # a directory the lock did not make keeps its (released) lock file
    with RunLock(tmp_path / "run"):
        info = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        with pytest.raises(RunDirError, match=rf"in use by another trainer \(pid {os.getpid()} on host "
                                              rf"{socket.gethostname()} since \d{{4}}-"):
            RunLock(tmp_path / "run").acquire()
    assert (tmp_path / "run" / LOCK_FILE).read_text() == ""  # released
    with RunLock(tmp_path / "run"):  # and free again
        pass


def test_lock_of_a_killed_process_is_stale(tmp_path, caplog):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from jaxrl.runtime.run_lock import RunLock; "
         "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)", str(tmp_path / "run")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunDirError, match=f"pid {holder.pid} "):
        RunLock(tmp_path / "run").acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with caplog.at_level(logging.WARNING, logger="jaxrl.runtime.run_lock"), RunLock(tmp_path / "run"):
        assert json.loads((tmp_path / "run" / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"taking over a stale lock left by pid {holder.pid} on host" in caplog.text


def test_lock_file_is_one_line_error_when_run_dir_is_a_file(tmp_path):
    (tmp_path / "run").write_text("x")
    with pytest.raises(RunDirError, match="cannot create the lock file"):
        RunLock(tmp_path / "run").acquire()


@pytest.mark.slow
def test_second_trainer_on_a_run_dir_exits_2(tmp_path):
    cfg, run_dir = T.write_config(tmp_path), tmp_path / "run"
    first = T.start(T.train_argv(cfg, run_dir, "train.steps=500"))
    try:
        T.wait_for_metrics(first, run_dir)
        second = T.run(T.train_argv(cfg, run_dir, "train.steps=500"))
        assert second.returncode == 2
        assert second.stderr.strip().splitlines()[-1].startswith(
            f"jaxrl train: error: run directory {run_dir} is in use by another trainer (pid {first.pid} on "
            "host")
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first trainer is unaffected
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=300)
    assert first.returncode == 75


def test_train_rm_takes_the_same_lock(tmp_path, monkeypatch, capsys):
    """`jaxrl train-rm` holds the run directory's lock like `train` (issue 30, item 9): a second trainer on a
    held directory exits 2 naming the holder, before any training starts."""
    from jaxrl.cli import main
    from jaxrl.reward_model import run as rm_run

    def must_not_train(cfg, run_dir):
        raise AssertionError(f"train-rm trained in {run_dir} while another trainer held its lock")

    monkeypatch.setattr(rm_run, "train_rm", must_not_train)
    with RunLock(tmp_path / "run"):
        assert main(["train-rm", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"jaxrl train-rm: error: run directory {tmp_path / 'run'} is in use by another "
                          f"trainer (pid {os.getpid()} on host")


def test_a_lock_that_made_the_run_dir_removes_it_if_nothing_else_was_written(tmp_path):
    """A command that fails before writing anything (a setup-time config error) leaves no directory behind;
    a directory it did not make, or one holding anything else, stays."""
    fresh = tmp_path / "fresh"
    RunLock(fresh).acquire().release()
    assert not fresh.exists()
    kept = tmp_path / "kept"
    with RunLock(kept):
        (kept / "metrics.jsonl").write_text("{}\n")
    assert sorted(p.name for p in kept.iterdir()) == [LOCK_FILE, "metrics.jsonl"]
    existing = tmp_path / "existing"
    existing.mkdir()
    RunLock(existing).acquire().release()
    assert existing.is_dir() and [p.name for p in existing.iterdir()] == [LOCK_FILE]
