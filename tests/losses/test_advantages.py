"""Tests for jaxrl.losses.advantages: spec 1.1 / 1.8 / 1.9 numbers, float64 numpy references, invariances."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import dynamic_sampling_mask, group_advantages, rloo_advantages


def _np_group_adv(rewards, g, scale, eps):
    r = np.asarray(rewards, np.float64).reshape(-1, g)
    if g == 1:
        mean, std = np.zeros_like(r), np.ones_like(r)
    else:
        mean = r.mean(1, keepdims=True)
        std = r.std(1, ddof=1, keepdims=True)
    if scale == "group":
        a = (r - mean) / (std + eps)
    elif scale == "none":
        a = r - mean
    else:
        a = (r - mean) / (np.asarray(rewards, np.float64).std(ddof=1) + eps)
    return a.reshape(-1)


def _random_rewards(seed, p=6, g=4):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(p, g))
    r[1] = 0.7  # zero-variance group
    r[2] = rng.integers(0, 2, size=g)  # binary group
    r[3] = [1.0] * (g - 1) + [0.0]  # rare failure
    return r.reshape(-1).astype(np.float32)


def test_spec_worked_example_grpo_verl_trl_drgrpo():
    r = jnp.array([1.0, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(group_advantages(r, 4), [0.499999, -1.499997, 0.499999, 0.499999], atol=1e-6)
    np.testing.assert_allclose(group_advantages(r, 4, eps=1e-4), [0.4999, -1.4997, 0.4999, 0.4999], atol=1e-4)
    np.testing.assert_allclose(group_advantages(r, 4, scale="none"), [0.25, -0.75, 0.25, 0.25], atol=0)
    np.testing.assert_array_equal(group_advantages(jnp.ones(4), 4), np.zeros(4))
    np.testing.assert_array_equal(group_advantages(jnp.ones(4), 4, scale="none"), np.zeros(4))


def test_rare_success_asymmetric_magnitudes():
    r = jnp.zeros(16).at[3].set(1.0)
    adv = group_advantages(r, 16)
    np.testing.assert_allclose(adv[3], 3.75, rtol=1e-5)
    np.testing.assert_allclose(adv[0], -0.25, rtol=1e-5)


@pytest.mark.parametrize("scale", ["group", "none", "batch"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_float64_reference(scale, seed):
    r = _random_rewards(seed)
    got = group_advantages(jnp.asarray(r), 4, scale=scale, eps=1e-4)
    np.testing.assert_allclose(got, _np_group_adv(r, 4, scale, 1e-4), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got)[4:8], np.zeros(4))  # zero-variance group -> exactly 0


@pytest.mark.parametrize("scale,expected", [("group", [2.0 / (1 + 1e-6), -1.0 / (1 + 1e-6)]),
                                            ("none", [2.0, -1.0])])
def test_group_size_one_is_verl_special_case(scale, expected):
    np.testing.assert_allclose(group_advantages(jnp.array([2.0, -1.0]), 1, scale=scale), expected, rtol=1e-7)


def test_nan_aware_matches_trl_semantics():
    r = jnp.array([1.0, jnp.nan, 0.0, 1.0, 0.5, 0.5, jnp.nan, 2.0])
    got = np.asarray(group_advantages(r, 4, nan_aware=True, eps=1e-4))
    finite = np.array([1.0, 0.0, 1.0])
    ref = (finite - finite.mean()) / (finite.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(got[[0, 2, 3]], ref, rtol=1e-5)
    assert got[1] == 0.0 and got[6] == 0.0
    ref2 = np.array([0.5, 0.5, 2.0])
    np.testing.assert_allclose(got[[4, 5, 7]], (ref2 - ref2.mean()) / (ref2.std(ddof=1) + 1e-4), rtol=1e-5)
    # Without nan_aware the NaN poisons its group only.
    plain = np.asarray(group_advantages(r, 4))
    assert np.isnan(plain[:4]).all() and np.isnan(plain[4:]).all()


def test_nan_aware_single_finite_reward_gives_zero():
    got = group_advantages(jnp.array([jnp.nan, 3.0, jnp.nan]), 3, nan_aware=True)
    np.testing.assert_array_equal(got, [0.0, 0.0, 0.0])


@pytest.mark.parametrize("fn", [lambda r: group_advantages(r, 4),
                                lambda r: group_advantages(r, 4, scale="batch"),
                                lambda r: rloo_advantages(r, 4)])
def test_permuting_within_group_permutes_advantages(fn):
    r = _random_rewards(3)
    perm = np.concatenate([np.random.default_rng(0).permutation(4) + 4 * p for p in range(6)])
    expected = np.asarray(fn(jnp.asarray(r)))[perm]
    np.testing.assert_allclose(fn(jnp.asarray(r[perm])), expected, rtol=1e-6, atol=1e-7)


def test_rloo_matches_reference_and_hand_example():
    np.testing.assert_allclose(rloo_advantages(jnp.array([1.0, 0.0, 1.0, 1.0]), 4),
                               [1 - 2 / 3, 0 - 1.0, 1 - 2 / 3, 1 - 2 / 3], rtol=1e-6)
    r = _random_rewards(4).astype(np.float64).reshape(-1, 4)
    ref = np.array([[r[p, i] - np.delete(r[p], i).mean() for i in range(4)] for p in range(len(r))]).ravel()
    np.testing.assert_allclose(rloo_advantages(jnp.asarray(r.reshape(-1), jnp.float32), 4), ref, atol=1e-6)


def test_dynamic_sampling_mask():
    nan = jnp.nan
    r = jnp.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.3, nan, 0.3, nan, 0.2, 0.9, nan, nan, nan])
    np.testing.assert_array_equal(dynamic_sampling_mask(r, 3),
                                  [True] * 3 + [False] * 3 + [False] * 3 + [True] * 3 + [False] * 3)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="not a multiple of group_size=4"):
        group_advantages(jnp.zeros(6), 4)
    with pytest.raises(ValueError, match="scale must be one of"):
        group_advantages(jnp.zeros(4), 4, scale="global")
    with pytest.raises(TypeError, match="floating"):
        group_advantages(jnp.zeros(4, jnp.int32), 4)
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(jnp.zeros(4), 1)
    with pytest.raises(AssertionError):
        group_advantages(jnp.zeros((2, 4)), 4)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        r = jnp.asarray(_random_rewards(5))
        for fn in (lambda x: group_advantages(x, 4), lambda x: group_advantages(x, 4, scale="batch"),
                   lambda x: rloo_advantages(x, 4), lambda x: dynamic_sampling_mask(x, 4)):
            np.testing.assert_allclose(self.variant(fn)(r), fn(r), rtol=1e-6, atol=1e-7)


# Rewards that are not exact in binary: a float32 group mean of G copies can be an ulp off (numpy: 0.7 x 7 ->
# 6e-8), which the old (R - mean) / (std + eps) turned into advantages of about ±0.056.
EQUAL = (0.7, 1 / 3, 0.1, 2.3)
_ZERO_FNS = {
    "grpo": lambda r, g: group_advantages(r, g),
    "grpo_nan_aware": lambda r, g: group_advantages(r, g, nan_aware=True),
    "dr_grpo": lambda r, g: group_advantages(r, g, scale="none"),
    "batch": lambda r, g: group_advantages(r, g, scale="batch"),
    "rloo": lambda r, g: rloo_advantages(r, g),
}


def _equal_groups(g: int) -> np.ndarray:
    """One group of G equal rewards per value of EQUAL, then one group with spread."""
    return np.concatenate([np.full(g, v, np.float32) for v in EQUAL] + [np.arange(g, dtype=np.float32) / 3])


def test_the_old_formula_was_not_zero_for_equal_rewards():
    """Guards the tests below: in float32, some of these groups do not centre to 0 by arithmetic alone."""
    off = []
    for g in (3, 5, 7, 16):
        r = _equal_groups(g)[: -g].reshape(-1, g)
        mean = r.mean(1, keepdims=True, dtype=np.float32)
        off.append(np.abs((r - mean) / (r.std(1, ddof=1, keepdims=True) + np.float32(1e-6))).max())
    assert max(off) > 0.01


class EqualRewardsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*_ZERO_FNS)
    def test_all_equal_group_gives_exactly_zero(self, name):
        for g in (3, 7, 16):
            fn = self.variant(lambda r, g=g: _ZERO_FNS[name](r, g))
            out = np.asarray(fn(jnp.asarray(_equal_groups(g))))
            np.testing.assert_array_equal(out[:-g], 0.0)
            assert np.all(out[-g:][[0, -1]] != 0.0)  # the group with spread still has a signal

    @chex.variants(with_jit=True, without_jit=True)
    def test_nan_aware_equal_finite_rewards_give_zero(self):
        r = jnp.array([0.7, jnp.nan, 0.7, 0.7, 1 / 3, 1 / 3, jnp.nan, 1 / 3], jnp.float32)
        out = self.variant(lambda x: group_advantages(x, 4, nan_aware=True))(r)
        np.testing.assert_array_equal(out, 0.0)
        plain = self.variant(lambda x: group_advantages(x, 4))(r)
        assert np.isnan(plain).all()  # without nan_aware a NaN still poisons its group
