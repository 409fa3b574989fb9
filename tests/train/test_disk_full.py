"""A full disk stops `jaxrl train` with one line and exit 2, and loses nothing (issue 30 item 7).

The checkpoint directory is a small tmpfs: one checkpoint fits, the next does not. Orbax's background threads
log every array they fail to write (hundreds of lines of tracebacks and tensorstore specs); jaxrl reports the
full disk once, naming the directory, the step and the newest intact checkpoint, and the same command resumes
from it once there is space. A metrics file cut short by a full disk is repaired on resume.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from _common import ROOT, env, metrics, train_cmd

from jaxrl.errors import CheckpointError
from jaxrl.runtime.metrics import MetricsWriter


def _mount_tmpfs(path: Path, size: int) -> None:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"a tmpfs cannot be mounted here ({done.stderr.strip()}): needs root")


def _resize(path: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def _used(path: Path) -> int:
    return shutil.disk_usage(path).used


def _train(run_dir: Path, steps: int) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(run_dir, f"train.steps={steps}"), cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=600)


def _not_log_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " INFO jaxrl" not in line and line.strip()]


@pytest.fixture
def ckpt_tmpfs(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    _mount_tmpfs(run_dir / "checkpoints", 64 << 20)
    yield run_dir
    subprocess.run(["umount", str(run_dir / "checkpoints")], check=False)


def test_full_checkpoint_disk_is_one_line_and_the_same_command_resumes(ckpt_tmpfs):
    run_dir, ckpts = ckpt_tmpfs, ckpt_tmpfs / "checkpoints"
    first = _train(run_dir, 1)
    assert first.returncode == 0, first.stderr[-2000:]
    one_step = sum(f.stat().st_size for f in (ckpts / "1").rglob("*") if f.is_file())
    _resize(ckpts, _used(ckpts) + one_step // 2)  # room for half of the next checkpoint

    full = _train(run_dir, 3)
    assert full.returncode == 2, "\n".join(_not_log_lines(full.stderr)[:40])  # the first lines say what failed
    assert _not_log_lines(full.stderr) == [
        f"jaxrl train: error: no space left on the device of {ckpts} while writing checkpoint step 2; step 1 is "
        "the newest intact checkpoint: free space (or point --run-dir elsewhere) and run the same command to "
        "resume"], full.stderr[-3000:]
    assert "Traceback" not in full.stderr and "RESOURCE_EXHAUSTED" not in full.stderr

    _resize(ckpts, 64 << 20)
    resumed = _train(run_dir, 3)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resum" in resumed.stderr.lower()
    rows = metrics(run_dir)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3], rows  # step 2 again, once
    assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())[-1] == 3


def test_a_metrics_file_cut_short_is_repaired_on_resume(tmp_path, caplog):
    rows = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 3, "lo')  # the disk filled mid-line
    caplog.set_level(logging.WARNING, "jaxrl.runtime.metrics")
    MetricsWriter(tmp_path, resume_step=2, tensorboard=False).close()
    assert (tmp_path / "metrics.jsonl").read_text() == text
    assert any("cut short" in r.getMessage() for r in caplog.records)

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "lo\n' + text)  # not the last line: not ours to drop
    with pytest.raises(CheckpointError, match="line 1 is not JSON"):
        MetricsWriter(tmp_path, resume_step=2, tensorboard=False)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "lo\n' + text  # left as it was
