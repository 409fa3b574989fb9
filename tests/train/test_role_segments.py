"""Advantages per role segment (`jaxrl.algorithms.segment_advantages`): a multi-agent rollout's roles are
normalised separately, each with its own group size, and never together (spec/multi-agent.md §3.8)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxrl.algorithms import (ALGORITHMS, AlgoSettings, ETRParams, GDPOParams, segment_advantages,
                              zero_std_group_frac)
from jaxrl.config import AlgorithmConfig
from jaxrl.errors import ConfigError
from jaxrl.rl.setup import _check_role_groups

SETTINGS = AlgoSettings(group_size=3, eps=1e-6, clip_low=0.2, clip_high=0.28, section=AlgorithmConfig())


def grpo_ref(r, g, eps=1e-6):
    """float64 GRPO: (R - mean_g) / (std_g + eps), unbiased std; a group of one: A = R / (1 + eps)."""
    r = np.asarray(r, np.float64).reshape(-1, g)
    if g == 1:
        return (r / (1 + eps)).reshape(-1)
    return ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + eps)).reshape(-1)


def rollout(seed=0):
    """Role 0: 4 rows in groups of 1; role 1: 6 rows in groups of 3; two reward columns."""
    rng = np.random.default_rng(seed)
    rewards_BR = rng.normal(size=(10, 2)).astype(np.float32)
    mask_BT = rng.random((10, 5)) < 0.8
    segment_B = np.asarray([0] * 4 + [1] * 6, np.int32)
    return rewards_BR, np.asarray([1.0, 0.5], np.float32), mask_BT, segment_B, (1, 3)


def test_grpo_per_segment_matches_float64_reference():
    r_BR, w_R, mask_BT, seg_B, sizes = rollout()
    adv = segment_advantages(ALGORITHMS["grpo"].advantages, r_BR, w_R, mask_BT, SETTINGS, seg_B, sizes)
    total = (r_BR.astype(np.float64) * w_R).sum(1)
    want_B = np.concatenate([grpo_ref(total[:4], 1), grpo_ref(total[4:], 3)])
    np.testing.assert_allclose(adv.adv_BT, want_B[:, None] * mask_BT, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv.clip_high_B, 0.28)


def test_batch_statistics_stay_inside_a_segment():
    """GDPO standardises over the batch: per segment here, so role 1's advantages do not depend on role 0's
    rewards, while one joint normalisation (what the segments prevent) would mix them."""
    r_BR, w_R, mask_BT, _, _ = rollout(1)
    r_BR, mask_BT = r_BR[:9], mask_BT[:9]
    seg_B, sizes = np.asarray([0] * 3 + [1] * 6, np.int32), (3, 3)  # role 0: 1 group, role 1: 2 groups of 3
    gdpo_settings = dataclasses.replace(SETTINGS, params=GDPOParams())
    gdpo = ALGORITHMS["gdpo"].advantages
    adv = segment_advantages(gdpo, r_BR, w_R, mask_BT, gdpo_settings, seg_B, sizes)
    alone = gdpo(r_BR[3:], w_R, mask_BT[3:], gdpo_settings)
    np.testing.assert_allclose(adv.adv_BT[3:], alone.adv_BT, rtol=1e-6, atol=1e-7)
    shifted = r_BR.copy()
    shifted[:3] = r_BR[0]  # role 0 without spread: its normalised rewards become 0
    adv2 = segment_advantages(gdpo, shifted, w_R, mask_BT, gdpo_settings, seg_B, sizes)
    np.testing.assert_allclose(adv2.adv_BT[3:], adv.adv_BT[3:], rtol=1e-6, atol=1e-7)
    joint, joint2 = gdpo(r_BR, w_R, mask_BT, gdpo_settings), gdpo(shifted, w_R, mask_BT, gdpo_settings)
    assert not np.allclose(joint.adv_BT[3:], joint2.adv_BT[3:], atol=1e-3)  # mixing roles would show


def test_interleaved_rows_equal_contiguous_rows():
    """After DAPO's concat a role's groups are not contiguous; each segment is gathered by its id."""
    r_BR, w_R, mask_BT, seg_B, sizes = rollout(2)
    order = np.asarray([4, 5, 6, 0, 1, 7, 8, 9, 2, 3])  # role 1 group, role 0 rows, role 1 group, role 0
    fn = ALGORITHMS["grpo"].advantages
    base = segment_advantages(fn, r_BR, w_R, mask_BT, SETTINGS, seg_B, sizes)
    mixed = segment_advantages(fn, r_BR[order], w_R, mask_BT[order], SETTINGS, seg_B[order], sizes)
    np.testing.assert_allclose(mixed.adv_BT, base.adv_BT[order], rtol=1e-6, atol=1e-7)


def test_no_segments_is_the_plain_estimator():
    r_BR, w_R, mask_BT, _, _ = rollout(3)
    r_BR, mask_BT = r_BR[:9], mask_BT[:9]
    fn = ALGORITHMS["etr"].advantages
    etr = dataclasses.replace(SETTINGS, params=ETRParams())
    a = segment_advantages(fn, r_BR, w_R, mask_BT, etr, None, ())
    b = fn(r_BR, w_R, mask_BT, etr)
    np.testing.assert_array_equal(a.adv_BT, b.adv_BT)
    np.testing.assert_array_equal(a.clip_low_B, b.clip_low_B)


def test_zero_std_groups_skip_groups_of_one():
    total = np.asarray([1, 2, 3, 4, 1, 1, 1, 0, 1, 2], np.float32)
    seg = np.asarray([0] * 4 + [1] * 6)
    assert zero_std_group_frac(total, 3, seg, (1, 3)) == pytest.approx(0.5)  # role 1: [1,1,1] and [0,1,2]
    assert np.isnan(zero_std_group_frac(total[:4], 3, seg[:4], (1, 3)))
    assert zero_std_group_frac(total[4:], 3, None, ()) == pytest.approx(0.5)


def test_setup_refuses_estimators_that_cannot_handle_the_roles_groups():
    _check_role_groups({"proposer": 1, "solver": 4}, ALGORITHMS["grpo"], "ssp")  # A = R for groups of one
    with pytest.raises(ConfigError, match="'rloo'.*>= 2 rows.*'proposer' has groups of 1"):
        _check_role_groups({"proposer": 1, "solver": 4}, ALGORITHMS["rloo"], "ssp")
    with pytest.raises(ConfigError, match="'dapo': its resampling needs one group size.*allowed: grpo"):
        _check_role_groups({"proposer": 1, "solver": 4}, ALGORITHMS["dapo"], "ssp")
    with pytest.raises(ConfigError, match="'clipo': its reward shaping"):
        _check_role_groups({"proposer": 2, "solver": 4}, ALGORITHMS["clipo"], "ssp")
    _check_role_groups({"solver": 4, "checker": 4}, ALGORITHMS["dapo"], "march")  # one size: fine


def test_setup_refuses_extra_rows_with_a_sequential_update():
    from types import SimpleNamespace

    from jaxrl.io.tokenizer import load_tokenizer
    from jaxrl.rl.setup import _multi_agent_system

    tok = load_tokenizer("builtin")
    from jaxrl.config import MultiAgentConfig

    cfg = lambda update: SimpleNamespace(rollout=SimpleNamespace(group_size=2), multi_agent=MultiAgentConfig(
        system="ssp", params={"corpus_size": "tiny", "update": update}))
    with pytest.raises(ConfigError, match="'sft_aux': its extra rows need one joint update.*update: joint"):
        _multi_agent_system(cfg("sequential"), tok, ALGORITHMS["sft_aux"])
    assert _multi_agent_system(cfg("joint"), tok, ALGORITHMS["sft_aux"]).update_phases == ()
    assert _multi_agent_system(cfg("sequential"), tok, ALGORITHMS["grpo"]).update_phases == (0, 1)
    with pytest.raises(ConfigError, match="update='both'"):
        _multi_agent_system(cfg("both"), tok, ALGORITHMS["grpo"])
