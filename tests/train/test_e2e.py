"""Two-step end-to-end runs of every algorithm on the tiny model (one subprocess for all, see _e2e_runner.py).

Each case asserts real behaviour: the required metrics exist and are finite, the parameters moved, the
algorithm-specific metric is present and sensible, and nothing compiles again after the first step.
"""

import json
import math
import subprocess
import sys

import pytest

from _common import HERE, ROOT, env
from _e2e_runner import CASES

REQUIRED = ("reward/mean", "reward/short/mean", "loss", "entropy", "clip_frac",
            "response_length/mean", "frac_zero_std_groups", "time/generation", "time/reward",
            "time/old_logprobs", "time/update", "time/step", "throughput/tokens_per_s_per_device/update",
            "train/grad_norm")

pytestmark = pytest.mark.slow  # one subprocess runs 13 tiny 2-3 step trainings (~100 s CPU)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e")
    out = base / "results.json"
    cmd = [sys.executable, str(HERE / "_e2e_runner.py"), str(out), str(base), *CASES]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _case(results, name):
    r = results[name]
    assert r["error"] is None, r["error"]
    return r


@pytest.mark.parametrize("name", list(CASES))
def test_two_steps_train_and_log_finite_metrics(results, name):
    r = _case(results, name)
    rows = r["rows"]
    assert [row["step"] for row in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 2
    for row in rows:
        per_reward = ("reward/digits/mean",) if name != "dapo" else ()  # dapo: the length reward only
        missing = [k for k in (*REQUIRED, *per_reward) if k not in row]
        assert not missing, f"missing metrics {missing}"
        bad = [k for k, v in row.items() if v is None or (isinstance(v, float) and not math.isfinite(v))]
        assert not bad, f"non-finite metrics {bad}"
        assert row["train/nonfinite"] == 0 and row["train/grad_norm"] > 0
        assert row["entropy"] > 0 and 0 <= row["clip_frac"] <= 1
        # `clip_frac` is the objective's own clip metric (`PolicyObjective.clip_frac_key`)
        assert row["clip_frac"] == row["cispo/clip_frac" if name == "cispo" else "pg/clip_frac"]
        # a KL that is not measured is not logged (no flat-zero curve); a measured one always is
        assert ("kl" in row) == name.startswith("kl_"), "kl logged without a reference, or missing with one"
    # two AdamW steps of lr 1e-2 move some parameter by about 2e-2
    assert 1e-3 < r["param_change"] < 0.1
    assert r["late_compiles"] == [], "a jitted function compiled again after step 1"


def test_warm_start_compiles_nothing_after_its_first_step(results):
    """The SFT warm start's train step compiles once, at its first step: the second step sees the same input
    shardings (the optimiser's scalars placed on the mesh, as the step returns them), so nothing compiles
    again (it did: 4 s of a tiny run's 40)."""
    r = _case(results, "rloo")
    assert r["warm_start_compiles"] == [], r["warm_start_compiles"]  # None: no warm start was logged


def test_etr_elastic_bounds_differ_from_fixed(results):
    rows = _case(results, "etr")["rows"]
    for row in rows:  # alpha = beta = 0.5 widen the trust region of informative samples
        assert row["etr/clip_low_mean"] > 0.2 and row["etr/clip_high_mean"] > 0.2


def test_clipo_head_trains_and_pays_a_bonus(results):
    rows = _case(results, "clipo")["rows"]
    assert all("clipo/head_loss" in row and "clipo/bonus_mean" in row for row in rows)
    assert any(row["clipo/head_loss"] > 0 for row in rows)


def test_gd2po_reports_kept_fraction(results):
    for row in _case(results, "gd2po")["rows"]:
        assert 0 < row["gd2po/keep_frac"] <= 1


def test_sft_aux_adds_the_expert_nll(results):
    rows = _case(results, "sft_aux")["rows"]
    assert all(row["sft/nll"] > 0 for row in rows)
    assert rows[1]["sft/nll"] < rows[0]["sft/nll"]  # the expert targets get likelier
    grpo = _case(results, "grpo")["rows"]
    # same seeds, same rollout: the policy term equals GRPO's and λ·NLL is added on top
    assert rows[0]["loss"] == pytest.approx(grpo[0]["loss"] + 0.5 * rows[0]["sft/nll"], rel=1e-5)


def test_dapo_dynamic_sampling_resamples_degenerate_groups(results):
    rows = _case(results, "dapo")["rows"]
    assert any(row["dapo/resample_rounds"] > 0 for row in rows), "no step needed resampling; test is vacuous"
    for row in rows:
        rounds, kept = row["dapo/resample_rounds"], row["dapo/kept_groups_frac"]
        assert kept == 1.0 or rounds == 3  # a batch short of informative groups only after all tries
        assert rounds > 0 or kept == 1.0
        # degenerate groups fill the batch only where tries ran out
        assert row["frac_zero_std_groups"] == pytest.approx(1.0 - kept)


@pytest.mark.parametrize("name", ["kl_loss", "kl_reward"])
def test_reference_kl_is_zero_then_positive(results, name):
    rows = _case(results, name)["rows"]
    assert abs(rows[0]["kl"]) < 1e-5  # the policy starts at the reference
    assert rows[1]["kl"] > 1e-4  # one update later it has moved away


def test_other_objectives_and_mismatch_correction_train(results):
    cispo = _case(results, "cispo")["rows"]
    assert all(0 < row["cispo/weight_mean"] for row in cispo)
    gspo = _case(results, "gspo_tis")["rows"]
    for row in gspo:  # the sampler's and the trainer's log-probs of one model agree closely on CPU
        assert 0 <= row["mismatch/abs_logp_diff_mean"] < 1e-3 and row["mismatch/is_weight_mean"] > 0.99
    # a run without correction still measures the mismatch (old log-probs recomputed by the trainer)
    assert all("mismatch/abs_logp_diff_mean" in row for row in _case(results, "grpo")["rows"])


def test_ppo_epochs_and_mini_batches_clip(results):
    rows = _case(results, "ppo")["rows"]
    # 2 epochs x 2 mini-batches = 4 updates per batch: later ones are off-policy and some ratios clip.
    assert any(row["clip_frac"] > 0 for row in rows)
    assert all(row["clip_frac"] == 0 for row in _case(results, "grpo")["rows"])
