"""Trainer reliability through the real CLI in subprocesses (one CPU device each, see _common.py):

* SIGKILL at a random point after a checkpoint, restart with the same command: metrics.jsonl (timing keys
  aside) and final parameters equal those of an uninterrupted run;
* SIGTERM saves a checkpoint and exits 75; the restarted run again equals the uninterrupted one;
* a corrupted newest checkpoint is skipped in favour of the previous one;
* an infinite learning rate makes every update non-finite: steps are skipped (parameters unchanged) and the
  run stops with exit 2, one clear line and a checkpoint;
* CLIPO's head/optimiser state and the KL reference (the SFT-warm-started model) survive a restart, and a run
  stopped right after its warm start resumes from step 0.

The uninterrupted run (`reference`, shared by the file's tests) is a CLIPO run with a KL term to its SFT-warm-
started model: the most state a restart must bring back (policy, optimiser, CLIPO head, reference model, data
position), and one set of programs to compile for every resume test of the file.
"""

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from _common import BASE, ROOT, env, metrics, run_train, train_cmd

pytestmark = pytest.mark.slow

STEPS = 6
# single-digit problems (the embedded default's answers have two digits), so some rollouts succeed
RESUME = ("algorithm.name=clipo", "algorithm.kl.beta=0.1", "sft_warmup.steps=2", "sft_warmup.batch_size=4",
          'data.params={max_operand: 9, ops: "+-"}', f"train.steps={STEPS}", "checkpoint.every=2",
          "checkpoint.keep=3", "checkpoint.async_save=true")


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"


def _params(run_dir: Path, step: int | None = None):
    from jaxrl.io import model_io

    path = run_dir / "checkpoints" / (str(step) if step is not None else "")
    model, _ = model_io.load_model_checkpoint(path)
    return jax.tree.leaves(nnx.state(model, nnx.Param).to_pure_dict())


def _steps(run_dir: Path) -> list[int]:
    d = run_dir / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def _wait_for_row(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 600) -> None:
    """Blocks until metrics.jsonl holds the row of `step` (the process must still be running)."""
    end = time.monotonic() + timeout
    f = run_dir / "metrics.jsonl"
    while time.monotonic() < end:
        if f.exists() and any(r["step"] >= step for r in metrics(run_dir)):
            return
        assert proc.poll() is None, f"trainer exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}"
        time.sleep(0.05)
    raise TimeoutError(f"no metrics row for step {step} after {timeout}s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run: checkpoints every 2 steps, the newest 3 kept, and the warm-started state as step 0
    (kept past checkpoint.keep: a resumed run's KL reference is read from it)."""
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    proc = run_train(run_dir, *RESUME)
    _ok(proc)
    assert "SFT warm start" in proc.stderr  # (what a resumed run must not log)
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, STEPS + 1))
    assert _steps(run_dir) == [0, 2, 4, 6]
    return run_dir


def test_sigkill_then_restart_reproduces_the_uninterrupted_run(reference, tmp_path):
    kill_after = random.Random(int(os.environ.get("JAXRL_TEST_SEED", "0")) + time.time_ns()).randint(2, 4)
    proc = subprocess.Popen(train_cmd(tmp_path, *RESUME), cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_row(proc, tmp_path, kill_after)
        # somewhere inside the next step; short, because a warm-cache step of the tiny model takes ~0.1 s and
        # the kill must land before the last step (STEPS) completes.
        time.sleep(random.Random(kill_after).uniform(0.0, 0.05))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(r["step"] for r in metrics(tmp_path))
    assert killed_at < STEPS, "the run finished before it was killed; the test proves nothing"
    restarted = run_train(tmp_path, *RESUME)
    _ok(restarted)
    assert "SFT warm start" not in restarted.stderr  # the KL reference is read from step 0, not rebuilt
    assert metrics(tmp_path) == metrics(reference), f"killed after step {killed_at}"
    for a, b in zip(_params(tmp_path), _params(reference), strict=True):
        assert np.array_equal(a, b)


def test_sigterm_saves_and_exits_75_then_resumes_exactly(reference, tmp_path):
    """SIGTERM (preemption) saves the step it stopped after and exits 75 (EX_TEMPFAIL), so a supervisor
    restarts the run instead of treating it as finished; stderr ends with one line saying so (no traceback),
    the run's lock is released, and the restart resumes bit-identically. (SIGINT: tests/runtime/test_signals.py.)"""
    overrides = (*RESUME, "checkpoint.every=5")  # no periodic checkpoint before step 5
    proc = subprocess.Popen(train_cmd(tmp_path, *overrides), cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_row(proc, tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 75, err[-3000:]
    stopped = max(r["step"] for r in metrics(tmp_path))
    assert stopped < STEPS
    # step 0: the warm start's state, saved before RL step 1
    assert _steps(tmp_path) == [0, stopped], "SIGTERM must save the step it stopped after (and no other)"
    assert "preemption" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"jaxrl train: stopped by SIGTERM after step {stopped}; checkpoint saved in {tmp_path}; run the same "
        f"command to resume (exit 75)")
    assert (tmp_path / ".jaxrl-train.lock").read_text() == ""  # released cleanly
    restarted = run_train(tmp_path, *overrides)
    _ok(restarted)
    assert f"resumed from step {stopped}" in restarted.stderr
    assert "SFT warm start" not in restarted.stderr  # the KL reference is read from step 0, not rebuilt
    assert metrics(tmp_path) == metrics(reference)


def test_corrupted_newest_checkpoint_falls_back_to_previous(reference, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    for f in (run_dir / "checkpoints" / "6" / "params").rglob("*"):
        if f.is_file():
            f.write_bytes(b"")  # truncated files: the step exists but cannot be restored
    proc = run_train(run_dir, *RESUME)
    _ok(proc)
    assert "checkpoint step 6" in proc.stderr and "cannot be restored" in proc.stderr
    assert any(p.name.startswith("corrupt-6") for p in (run_dir / "checkpoints").iterdir())
    assert "resumed from step 4" in proc.stderr and "SFT warm start" not in proc.stderr
    assert metrics(run_dir) == metrics(reference)  # steps 5 and 6 re-run from step 4, identically
    for a, b in zip(_params(run_dir), _params(reference), strict=True):
        assert np.array_equal(a, b)


def test_nonfinite_updates_are_skipped_then_the_run_stops_with_a_checkpoint(tmp_path):
    from jaxrl.io import build
    from jaxrl.config import load_config

    overrides = ("algorithm.name=grpo", f"train.steps={STEPS}", "checkpoint.every=100",
                 "optimizer.lr=.inf", "optimizer.max_nonfinite_steps=2")
    proc = run_train(tmp_path, *overrides)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("jaxrl train: error: 2 consecutive steps had a non-finite loss or gradient")
    assert "optimizer.max_nonfinite_steps=2" in last and "Traceback" not in proc.stderr
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["train/nonfinite"] for r in rows] == [1.0, 1.0]
    assert all(np.isfinite(r["loss"]) for r in rows)  # the loss was fine; the update was not
    assert _steps(tmp_path) == [2]
    cfg = load_config(None, [*BASE, *(o for o in overrides if "lr" not in o)])
    tok = build.build_tokenizer(cfg.model, cfg.tokenizer)
    init = nnx.state(build.build_model(cfg.model, vocab_size=len(tok), seed=cfg.train.seed), nnx.Param)
    for a, b in zip(_params(tmp_path, 2), jax.tree.leaves(init.to_pure_dict()), strict=True):
        assert np.array_equal(a, b), "a skipped step must leave the parameters unchanged"


def test_resume_restores_clipo_head_and_warm_started_reference(reference, tmp_path):
    """CLIPO's head/optimiser state and the KL reference (the SFT-warm-started model) survive a restart: the
    resumes from steps 2-4 of the tests above (SIGKILL, SIGTERM, corrupted checkpoint) equal the uninterrupted
    run, KL and CLIPO's head loss included, and read the reference from step 0 instead of repeating the warm
    start. Here: the run cut back to its warm start (stopped before its first periodic checkpoint) resumes from
    step 0, without a second warm start, and takes exactly the uninterrupted run's steps (to a smaller
    `train.steps` than the uninterrupted run's: nothing depends on it)."""
    rows = metrics(reference)
    assert rows[3]["clipo/head_loss"] > 0
    assert abs(rows[0]["kl"]) < 1e-5 and rows[3]["kl"] > 1e-4  # KL to the warm-started model starts at 0
    zero = tmp_path / "zero"
    shutil.copytree(reference, zero)
    for step in (2, 4, 6):
        shutil.rmtree(zero / "checkpoints" / str(step))
    (zero / "metrics.jsonl").write_text("")
    from_zero = run_train(zero, *RESUME, "train.steps=4")
    _ok(from_zero)
    assert "SFT warm start" not in from_zero.stderr and "resumed from step 0" in from_zero.stderr
    assert metrics(zero) == rows[:4]
    assert _steps(zero) == [0, 2, 4]  # the warm-started state is kept as step 0
