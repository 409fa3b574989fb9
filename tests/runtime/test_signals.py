"""SIGTERM / SIGINT during `jaxrl train` (real subprocesses): a checkpoint is saved, the exit code says how
the run stopped (75 preempted / 130 interrupted, `jaxrl.errors`), stderr ends with one line and no traceback,
and the same command resumes from the saved step."""

import signal

import pytest

from jaxrl.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED
from tests.runtime import _trainer as T


@pytest.mark.slow
@pytest.mark.parametrize("signum,code,name", [(signal.SIGTERM, EXIT_PREEMPTED, "SIGTERM"),
                                              (signal.SIGINT, EXIT_INTERRUPTED, "SIGINT")])
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
