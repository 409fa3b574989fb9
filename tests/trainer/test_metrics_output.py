"""Quiet, honest output (issue 14 item 10): the bar shows the step just written, plain log lines every
`logging.every` steps without a bar, rows and samples to the trackers, no plot of a metric that was not
measured, YAML errors with line and column."""

from __future__ import annotations

import io
import json
import logging

import pytest

from jaxrl import cli
from jaxrl.config import LoggingConfig, WandbConfig, load_config
from jaxrl.errors import ConfigError
from jaxrl.runtime.metrics import MetricsWriter, plain_line
from jaxrl.runtime.plot import plot_runs


def _last_frame(text: str) -> str:
    return text.replace("\r", "\n").strip().splitlines()[-1]


def test_bar_shows_the_step_just_written(tmp_path):
    stream = io.StringIO()
    with MetricsWriter(tmp_path, total_steps=3, tensorboard=False, primary=True, bar_file=stream) as w:
        w.write(1, {"reward/mean": 0.25, "loss": 1.5})
        frame = _last_frame(stream.getvalue())
        assert frame.startswith(" 33%") or "1/3" in frame
        assert "reward=0.25" in frame and "loss=1.5" in frame, frame
        w.write(2, {"reward/mean": 0.75, "loss": -2.0})
        frame = _last_frame(stream.getvalue())
        assert "2/3" in frame and "reward=0.75" in frame and "loss=-2" in frame, frame


def test_plain_lines_every_n_steps_without_a_bar(tmp_path, caplog):
    stream = io.StringIO()
    caplog.set_level(logging.INFO, logger="jaxrl.runtime.metrics")
    with MetricsWriter(tmp_path, total_steps=5, tensorboard=False, primary=True, progress_bar=False,
                       log_every=2, bar_file=stream) as w:
        for step in range(1, 6):
            w.write(step, {"reward/mean": step / 10, "loss": float(step), "kl": float("nan"), "other": 3.0})
    lines = [r.getMessage() for r in caplog.records if r.name == "jaxrl.runtime.metrics"]
    assert lines == ["step 2/5: reward/mean 0.2, loss 2, kl nan", "step 4/5: reward/mean 0.4, loss 4, kl nan",
                     "step 5/5: reward/mean 0.5, loss 5, kl nan"]  # every 2nd step, and the last one
    assert stream.getvalue() == ""  # no bar drawn
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[0]["kl"] is None  # the file keeps every step


def test_from_config_reads_the_logging_section(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="jaxrl.runtime.metrics")
    cfg = LoggingConfig(every=3, progress_bar=False, tensorboard=False)
    with MetricsWriter.from_config(tmp_path, cfg, total_steps=7, primary=True) as w:
        for step in range(1, 8):
            w.write(step, {"loss": 0.5})
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["step 3/7", "step 6/7", "step 7/7"]
    assert plain_line({"step": 4}) == "step 4"


class _FakeTracker:
    def __init__(self):
        self.logged, self.samples, self.closed = [], [], False

    def log(self, step, metrics):
        self.logged.append((step, dict(metrics)))

    def log_samples(self, step, rows):
        self.samples.append((step, list(rows)))

    def close(self):
        self.closed = True


def test_trackers_get_every_numeric_row_and_the_samples(tmp_path):
    """The writer's side of `jaxrl.runtime.trackers` (tests/train/test_trackers.py runs the real W&B and MLflow)."""
    tracker = _FakeTracker()
    with MetricsWriter(tmp_path, tensorboard=False, primary=True, progress_bar=False, trackers=[tracker]) as w:
        w.write(1, {"loss": 0.5, "flag": True, "note": "x", "kl": float("nan")})
        w.write_samples(1, ["p"], ["c"], [0.25])
    assert tracker.logged == [(1, {"loss": 0.5})]  # no bools, strings or NaN (null)
    assert tracker.samples == [(1, [{"step": 1, "prompt": "p", "completion": "c", "reward": 0.25}])]
    assert tracker.closed
    with MetricsWriter(tmp_path, tensorboard=False, primary=False, trackers=[_FakeTracker()]) as w:
        w.write(2, {"loss": 0.25})  # not process 0: nothing is written or logged
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


def test_only_process_0_makes_trackers(tmp_path):
    cfg = LoggingConfig(trackers=("tensorboard", "wandb", "mlflow"), progress_bar=False)
    with MetricsWriter.from_config(tmp_path / "run", cfg, total_steps=1, primary=False) as w:
        w.write(1, {"loss": 0.5})
        w.write_samples(1, ["p"], ["c"], [0.25])
    assert not (tmp_path / "run").exists()  # no tb/, wandb/, mlruns/, trackers.json, metrics.jsonl


def test_wandb_config_is_validated(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("logging: {every: 2}\n")
    cfg = load_config(path, ["logging.wandb.project=demo"])
    assert cfg.logging.wandb == WandbConfig(project="demo", mode="offline")
    assert load_config(path, []).logging.wandb is None
    with pytest.raises(ConfigError, match=r"logging.wandb.mode='cloud': allowed values are 'online'"):
        load_config(path, ["logging.wandb.mode=cloud"])


def _run_dir(path, kl_beta, kl_values):
    path.mkdir()
    (path / "config.yaml").write_text(f"algorithm:\n  name: grpo\n  kl_beta: {kl_beta}\n")
    rows = [{"step": s, "reward/mean": 0.1 * s, "kl": kl} for s, kl in enumerate(kl_values, 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_plot_skips_kl_a_run_did_not_measure(tmp_path):
    off = _run_dir(tmp_path / "off", 0.0, [0.0, 0.0, 0.0])  # an older run's placeholder zeros
    written = {p.name for p in plot_runs([off], tmp_path / "plots_off")}
    assert "reward.png" in written and "kl.png" not in written
    on = _run_dir(tmp_path / "on", 0.05, [0.0, 0.01, 0.02])
    assert "kl.png" in {p.name for p in plot_runs([on], tmp_path / "plots_on")}
    nested = tmp_path / "nested"
    nested.mkdir()
    (nested / "config.yaml").write_text("algorithm: {name: grpo, kl: {beta: 0.0}}\n")
    (nested / "metrics.jsonl").write_text(json.dumps({"step": 1, "kl": 0.0, "reward/mean": 1.0}) + "\n")
    assert "kl.png" not in {p.name for p in plot_runs([nested], tmp_path / "plots_nested")}


@pytest.mark.parametrize("text, where", [
    ("model:\n  preset: tiny\n  dtype: [float32\noptimizer: {lr: 1}\n", ":4:10: invalid YAML: expected ','"),
    ("train:\n  steps: 1\n    seed: 2\n", ":3:9: invalid YAML: mapping values are not allowed here"),
])
def test_yaml_errors_keep_line_and_column(tmp_path, capsys, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert cli.main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}{where}" in err and err.count("\n") == 1, err


def test_step_time_bars_of_an_async_run_stack_the_exposed_collection():
    """An asynchronous run collects while it updates: its bars stack what the trainer waited for in place of
    the collector's own (overlapped) stages, so the stack does not exceed the step."""
    from jaxrl.runtime.plot import _stages

    sync = [{"time/generation": 1.0, "time/reward": 0.1, "time/update": 2.0, "time/step": 3.1}]
    stale = [{**sync[0], "time/exposed_generation": 0.2, "time/step": 2.2}]
    assert _stages(sync) == ["generation", "reward", "update"]
    assert _stages(stale) == ["exposed_generation", "update"]
