"""SIGINT during `jaxrl train` (a real subprocess): a checkpoint is saved, the exit code says how the run
stopped (130 interrupted, `jaxrl.errors`), stderr ends with one line and no traceback, and the same command
resumes from the saved step. SIGTERM (75, preempted) has the same assertions, and a bit-identical resume, in
tests/train/test_resume.py::test_sigterm_saves_and_exits_75_then_resumes_exactly (until 2026-11-28 it also
ran here: a second CLI pair for the same behaviour)."""

import signal

import pytest

from jaxrl.errors import EXIT_INTERRUPTED
from tests.runtime import _trainer as T


@pytest.mark.slow
@pytest.mark.parametrize("signum,code,name", [(signal.SIGINT, EXIT_INTERRUPTED, "SIGINT")])
def test_signal_saves_checkpoint_exits_nonzero_and_resumes(tmp_path, signum, code, name):
    cfg, run_dir = T.write_config(tmp_path), tmp_path / "run"
    proc = T.start(T.train_argv(cfg, run_dir, "train.steps=500"))
    T.wait_for_metrics(proc, run_dir)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err
    saved = T.steps_in(run_dir)
    last = T.metric_steps(run_dir)[-1]
    assert saved == [last] and 0 < last < 500
    final = err.strip().splitlines()[-1]
    assert final == (f"jaxrl train: stopped by {name} after step {last}; checkpoint saved in {run_dir}; run "
                     f"the same command to resume (exit {code})")
    assert (run_dir / ".jaxrl-train.lock").read_text() == ""  # released cleanly

    again = T.run(T.train_argv(cfg, run_dir, f"train.steps={last + 1}"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from step {last}" in again.stderr
    assert T.metric_steps(run_dir)[-1] == last + 1 and T.steps_in(run_dir)[-1] == last + 1
