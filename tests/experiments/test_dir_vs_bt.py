"""experiments/dir_vs_bt.py: the report's statistics on hand-made runs, and a 20-step run whose evaluation
curve ends at the final report's numbers.

The direction (DIR's mean |corr| below BT's) is asserted at 600 steps over four seeds by
tests/reward_model/test_bias_demo.py; it is not robust at this test's 20 steps, so it is not repeated here.
"""

import numpy as np
import pytest

from experiments import dir_vs_bt


def _fake(acc, corr, bias="length"):
    return {"steps": np.array([100, 200]), "accuracy": np.array([0.5, acc]),
            "abs_corr": np.array([0.9, corr]),
            "final": {"accuracy": acc, "attributes": {bias: {"correlation": -corr}}}}


def test_report_by_hand(tmp_path):
    runs = {"BT": [_fake(0.5, 0.8), _fake(0.6, 0.6)], "DIR": [_fake(0.9, 0.2), _fake(0.7, 0.7)]}
    text = dir_vs_bt.report(runs, [0, 1], tmp_path, seconds=60.0, steps=200)
    assert "lower than BT's in 1 of 2 seeds" in text
    # BT accuracy mean 0.55, std(ddof=1) = 0.0707; DIR |corr| mean 0.45, std 0.3536
    assert "| BT | 0.550 ± 0.071 [0.500, 0.600] | 0.700 ± 0.141 [0.600, 0.800] |" in text
    assert "| DIR | 0.800 ± 0.141 [0.700, 0.900] | 0.450 ± 0.354 [0.200, 0.700] |" in text
    assert (tmp_path / "dir_vs_bt.png").stat().st_size > 1000
    assert (tmp_path / "dir_vs_bt.md").read_text() == text


@pytest.mark.slow  # ~20 s idle
def test_curve_ends_at_final_report(tmp_path):
    out = dir_vs_bt.run_one(dir_vs_bt.METHODS["BT"], 0, 20, tmp_path / "bt", eval_every=10)
    assert out["steps"].tolist() == [10, 20]
    assert out["accuracy"][-1] == pytest.approx(out["final"]["accuracy"], abs=1e-6)
    assert out["abs_corr"][-1] == pytest.approx(abs(out["final"]["attributes"]["length"]["correlation"]),
                                                abs=1e-6)
    assert np.all((out["abs_corr"] >= 0) & (out["abs_corr"] <= 1))


def test_second_bias_report_and_overrides(tmp_path):
    runs = {"BT": [_fake(0.5, 0.8, "sycophancy")], "DIR": [_fake(0.9, 0.2, "sycophancy")]}
    text = dir_vs_bt.report(runs, [0], tmp_path, seconds=60.0, steps=200, bias="sycophancy")
    assert text.startswith("Bias sycophancy.") and "abs corr(margin, chosen sycophancy)" in text
    assert "lower than BT's in 1 of 1 seeds" in text
    assert (tmp_path / "dir_vs_bt_sycophancy.md").read_text() == text
    assert not (tmp_path / "dir_vs_bt.md").exists()
    assert dir_vs_bt.bias_overrides("length") == []
    assert "debias.attribute=sycophancy" in dir_vs_bt.bias_overrides("sycophancy")


@pytest.mark.slow  # ~20 s idle
def test_sycophancy_run_measures_its_own_attribute(tmp_path):
    """The planted bias and the measured attribute follow --bias: the config plants the sycophantic opener
    and debiases it, and the curve's last |corr| is the final report's sycophancy correlation."""
    from jaxrl.reward_model.config import load_rm_config

    cfg = load_rm_config(dir_vs_bt.METHODS["DIR"], dir_vs_bt.bias_overrides("sycophancy"))
    assert cfg.data.params["bias"] == "sycophancy" and cfg.debias.attribute == "sycophancy"
    out = dir_vs_bt.run_one(dir_vs_bt.METHODS["DIR"], 0, 20, tmp_path / "dir", eval_every=20,
                            bias="sycophancy")
    assert out["abs_corr"][-1] == pytest.approx(
        abs(out["final"]["attributes"]["sycophancy"]["correlation"]), abs=1e-6)
