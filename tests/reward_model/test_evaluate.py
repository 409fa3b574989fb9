"""Evaluation statistics on hand-made margins, and preference-file loading errors."""

import json
import math

import numpy as np
import pytest

from jaxrl.errors import UserError
from jaxrl.reward_model.data import load_pairs
from jaxrl.reward_model.evaluate import margin_report, pearson, plugin_mi


def test_plugin_mi_hand_computed():
    a = np.array([0, 0, 1, 1])
    assert plugin_mi(np.array([-2.0, -1.0, 1.0, 2.0]), a, bins=2) == pytest.approx(math.log(2))
    assert plugin_mi(np.array([-2.0, 1.0, -1.0, 2.0]), a, bins=2) == pytest.approx(0.0, abs=1e-12)
    # bins {(-3, a=0), (-2, a=1)} and {(-1, a=0), (5, a=0)}: p(b0,a0) = p(b0,a1) = 1/4, p(b1,a0) = 1/2.
    m, a = np.array([-3.0, -2.0, -1.0, 5.0]), np.array([0, 1, 0, 0])
    want = 0.25 * math.log(0.25 / (0.5 * 0.75)) + 0.25 * math.log(0.25 / (0.5 * 0.25)) \
        + 0.5 * math.log(0.5 / (0.5 * 0.75))
    assert plugin_mi(m, a, bins=2) == pytest.approx(want, abs=1e-12)


def test_report_accuracy_and_correlation():
    m = np.array([1.0, 2.0, -1.0, 0.5])
    a = np.array([1, 1, 0, 0])
    rep = margin_report(m, {"length": a})
    assert rep["accuracy"] == 0.75
    assert rep["attributes"]["length"]["correlation"] == pytest.approx(np.corrcoef(m, a)[0, 1])
    length = rep["attributes"]["length"]
    assert length["accuracy_a1"] == 1.0 and length["accuracy_a0"] == 0.5
    assert pearson(m, np.zeros(4)) == 0.0


def test_load_pairs_errors(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text(json.dumps({"q": "1+1=", "c": "2", "r": "3"}) + "\n\n")
    assert load_pairs(good, prompt_field="q", chosen_field="c", rejected_field="r") == \
        [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}]
    with pytest.raises(UserError, match="row 0 has no string field 'prompt'"):
        load_pairs(good)
    bad = tmp_path / "b.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(UserError, match="b.jsonl:1: invalid JSON"):
        load_pairs(bad)
    with pytest.raises(UserError, match="not found"):
        load_pairs(tmp_path / "none.jsonl")
