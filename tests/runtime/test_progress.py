"""Long phases log progress without a terminal (issue 31 item 4): `jaxrl.runtime.progress`, and the phases that use it
(held-out evaluation, HF import and export). A fake clock stands in for a slow phase."""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest

from jaxrl.rl import evaluate as evaluate_lib
from jaxrl.io import hf
from jaxrl.runtime import progress
from jaxrl.sampling import SamplingSpec


@pytest.fixture
def clock(monkeypatch):
    """A clock that advances `tick[0]` seconds each time it is read."""
    tick, t = [0.0], [0.0]

    def read():
        t[0] += tick[0]
        return t[0]

    monkeypatch.setattr(progress, "_now", read)
    return tick


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "jaxrl.runtime.progress"]


def test_a_short_phase_is_silent_and_a_long_one_logs_every_interval(clock, caplog):
    caplog.set_level(logging.INFO, "jaxrl.runtime.progress")
    clock[0] = 1.0  # ten units in ~10 s: under the interval after every unit but the last
    assert list(progress.tracked(range(9), "quick", unit="items")) == list(range(9))
    assert _lines(caplog) == []

    clock[0] = 4.0  # each clock read 4 s later: start at 4, units at 8, 12, 16 (a line: 12 s since the start)
    assert list(progress.tracked(range(5), "slow", unit="items")) == list(range(5))  # ..., 20, 24; done at 28
    assert _lines(caplog) == ["slow: 3/5 items (12 s)", "slow: done, 5/5 items in 24.0 s"]


def test_evaluation_logs_its_batches(clock, caplog):
    caplog.set_level(logging.INFO, "jaxrl.runtime.progress")
    clock[0] = 6.0

    def collect(params, batch, spec, seed):
        return types.SimpleNamespace(rewards_BR=np.ones((len(batch) * spec.num_samples, 1)), reward_names=("a",))

    records = [{"prompt": str(i)} for i in range(8)]
    out = evaluate_lib.evaluate(collect, None, records, lambda r: r, SamplingSpec(max_new_tokens=1),
                                batch_size=2)
    assert out["eval/accuracy"] == 1.0
    lines = _lines(caplog)
    assert any(line.startswith("evaluation (greedy): ") and line.endswith(" s)") for line in lines), lines
    assert lines[-1].startswith("evaluation (greedy): done, 4/4 batches in "), lines


def test_hf_export_and_import_log_their_tensors(clock, caplog, tmp_path):
    from tests.hf._tiny_hf import make_tiny_hf

    make_tiny_hf("llama", tmp_path / "src")
    caplog.set_level(logging.INFO, "jaxrl.runtime.progress")
    clock[0] = 6.0
    model = hf.from_pretrained(tmp_path / "src")
    hf.save_pretrained(model, tmp_path / "out")
    lines = _lines(caplog)
    imported = [line for line in lines if line.startswith(f"import {tmp_path / 'src'}: ")]
    exported = [line for line in lines if line.startswith(f"export {tmp_path / 'out'}: ")]
    assert imported and imported[-1].startswith(f"import {tmp_path / 'src'}: done, "), lines
    assert exported and exported[-1].startswith(f"export {tmp_path / 'out'}: done, "), lines
    for line in (imported[-1], exported[-1]):  # every tensor counted: "done, 21/21 tensors in ..."
        n, total = map(int, line.split(": done, ")[1].split(" ")[0].split("/"))
        assert n == total > 1, line
