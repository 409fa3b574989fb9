"""MetricsWriter files (jsonl, TensorBoard, samples, resume truncation) and `jaxrl plot` PNGs."""

import json

import numpy as np
import pytest

from jaxrl.cli import main
from jaxrl.runtime.metrics import MetricsWriter, read_metrics, reduce_across_hosts


def _write_run(run_dir, steps, scale, resume_step=0, tensorboard=False):
    with MetricsWriter(run_dir, resume_step=resume_step, tensorboard=tensorboard, total_steps=steps) as w:
        for step in range(resume_step + 1, steps + 1):
            w.write(
                step,
                {
                    "reward/mean": np.float32(scale * step),
                    "reward/answer/mean": scale,
                    "eval/accuracy": step / steps,
                    "kl": float("nan"),
                    "entropy": 1.0 / step,
                    "response_length/mean": np.int32(10 + step),
                    "note": "x",
                },
            )
            w.write_samples(step, ["p1", "p2"], ["c1", "c2"], [1.0, float("nan")])


def test_metrics_files(tmp_path):
    _write_run(tmp_path, 3, 0.5, tensorboard=True)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["reward/mean"] == 1.0 and rows[1]["response_length/mean"] == 12
    assert rows[0]["kl"] is None and rows[0]["note"] == "x"
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and samples[0] == {"step": 1, "prompt": "p1", "completion": "c1", "reward": 1.0}
    assert samples[1]["reward"] is None
    scalars = _read_tb_scalars(tmp_path / "tb")
    assert scalars["reward/mean"] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert [s for s, _ in scalars["response_length/mean"]] == [1, 2, 3]
    assert "note" not in scalars and "kl" not in scalars  # strings and NaN (null) are not TB scalars


def _read_tb_scalars(tb_dir):
    """{tag: [(step, value)]} from TFRecord event files (u64 length, u32 crc, payload, u32 crc)."""
    from tensorboardX.proto import event_pb2

    out = {}
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            n = int.from_bytes(data[pos : pos + 8], "little")
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
            pos += 16 + n
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_resume_drops_rows_after_the_checkpoint(tmp_path):
    _write_run(tmp_path, 5, 1.0)  # a killed run got to step 5 ...
    _write_run(tmp_path, 6, 1.0, resume_step=3)  # ... but resumes from checkpoint 3
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
    steps = [json.loads(x)["step"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert steps == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]


def test_non_primary_writes_nothing(tmp_path):
    with MetricsWriter(tmp_path / "r", primary=False) as w:
        w.write(1, {"loss": 1.0})
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="scalars"):
        with MetricsWriter(tmp_path / "s", tensorboard=False) as w:
            w.write(1, {"loss": np.ones(2)})


def test_reduce_single_host():
    assert reduce_across_hosts({"a": 1.5, "b": 2.0}) == {"a": 1.5, "b": 2.0}
    with pytest.raises(ValueError, match="op="):
        reduce_across_hosts({"a": 1.0}, op="median")


def test_plot_command_writes_pngs(tmp_path, capsys):
    _write_run(tmp_path / "a", 4, 1.0)
    _write_run(tmp_path / "b", 4, 2.0)
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "plots")]) == 0
    names = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    # kl is all-NaN: no panel for it
    assert names == ["accuracy.png", "entropy.png", "response_length.png", "reward.png", "reward_answer.png"]
    for p in (tmp_path / "plots").glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    assert "reward.png" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
