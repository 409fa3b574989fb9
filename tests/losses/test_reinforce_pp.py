"""Tests for jaxrl.losses.reinforce_pp: hand-computed cases, a float64 transcription of verl's formulas,
jit equality, invariances, and the estimators registered as `algorithm.name: reinforce_pp[_baseline]`."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import reinforce_pp_advantages, reinforce_pp_baseline_advantages


def _verl_whiten(values, mask):
    """verl `masked_whiten`: masked mean, unbiased masked variance, (x - mean) * rsqrt(var + 1e-8)."""
    n = mask.sum()
    mean = (values * mask).sum() / (n + 1e-8)
    var = (((values - mean) ** 2) * mask).sum() / (n + 1e-8) * n / (n - 1)
    return (values - mean) / np.sqrt(var + 1e-8)


def _verl_reinforce_pp(rewards, mask, gamma):
    """verl `compute_reinforce_plus_plus_outcome_advantage` in float64: the outcome reward sits at the last
    response token; returns by a reversed loop whose running return is multiplied by the mask."""
    mask = np.asarray(mask, np.float64)
    token_rewards = np.zeros_like(mask)
    last = mask.sum(1).astype(int) - 1
    token_rewards[np.arange(len(rewards)), last] = rewards
    returns = np.zeros_like(mask)
    running = np.zeros(len(rewards))
    for t in reversed(range(mask.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return _verl_whiten(returns, mask) * mask


def _verl_reinforce_pp_baseline(rewards, index, mask):
    """verl `compute_reinforce_plus_plus_baseline_outcome_advantage` in float64: minus the mean score of the
    row's prompt index (0 for an index with one row), tiled over the mask, whitened, times the mask."""
    mask = np.asarray(mask, np.float64)
    scores = np.asarray(rewards, np.float64).copy()
    means = {i: (np.mean(scores[index == i]) if (index == i).sum() > 1 else 0.0) for i in set(index.tolist())}
    scores = scores - np.array([means[i] for i in index.tolist()])
    return _verl_whiten(scores[:, None] * mask, mask) * mask


def _prefix_mask(lengths, t):
    return np.arange(t)[None, :] < np.asarray(lengths)[:, None]


def test_hand_computed_reinforce_pp():
    # rewards [1, 0]; lengths 3 and 2. gamma 1: returns 1,1,1 | 0,0 -> mean 0.6, unbiased var 1.2/4 = 0.3.
    mask = jnp.asarray(_prefix_mask([3, 2], 3))
    adv = reinforce_pp_advantages(jnp.array([1.0, 0.0]), mask)
    a, b = 0.4 / np.sqrt(0.3 + 1e-8), -0.6 / np.sqrt(0.3 + 1e-8)  # 0.730297, -1.095445
    np.testing.assert_allclose(adv, [[a, a, a], [b, b, 0.0]], rtol=1e-6)
    # gamma 0.5: returns 0.25, 0.5, 1 | 0, 0 -> mean 0.35, var 0.7/4 = 0.175
    adv = reinforce_pp_advantages(jnp.array([1.0, 0.0]), mask, gamma=0.5)
    s = np.sqrt(0.175 + 1e-8)
    expected = [[-0.1 / s, 0.15 / s, 0.65 / s], [-0.35 / s, -0.35 / s, 0.0]]  # -0.239046, 0.358569, 1.553797
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


def test_hand_computed_reinforce_pp_baseline():
    # rewards [1, 0 | 0.5, 0.5] in groups of 2, lengths 2, 1, 2, 2: baselines 0.5, -0.5 | 0, 0 (equal group:
    # exactly 0). Tokens 0.5, 0.5, -0.5, 0 x4: mean 1/14, unbiased var (5/7)/6 = 5/42.
    mask = jnp.asarray(_prefix_mask([2, 1, 2, 2], 2))
    adv = reinforce_pp_baseline_advantages(jnp.array([1.0, 0.0, 0.5, 0.5]), 2, mask)
    s = np.sqrt(5 / 42 + 1e-8)
    hi, lo, mid = (0.5 - 1 / 14) / s, (-0.5 - 1 / 14) / s, (-1 / 14) / s  # 1.242118, -1.656157, -0.207020
    np.testing.assert_allclose(adv, [[hi, hi], [lo, 0.0], [mid, mid], [mid, mid]], rtol=1e-6)


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5, 0.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_pp_matches_verl_transcription(seed, gamma):
    rng = np.random.default_rng(seed)
    n, t = 12, 9
    rewards = rng.normal(size=n)
    mask = _prefix_mask(rng.integers(1, t + 1, size=n), t)
    got = reinforce_pp_advantages(jnp.asarray(rewards, jnp.float32), jnp.asarray(mask), gamma=gamma)
    np.testing.assert_allclose(got, _verl_reinforce_pp(rewards, mask, gamma), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_pp_baseline_matches_verl_transcription(seed, g):
    rng = np.random.default_rng(seed)
    n, t = 12, 7
    rewards = rng.integers(0, 3, size=n).astype(np.float64) / 2  # ties and equal groups
    mask = _prefix_mask(rng.integers(1, t + 1, size=n), t)
    got = reinforce_pp_baseline_advantages(jnp.asarray(rewards, jnp.float32), g, jnp.asarray(mask))
    expected = _verl_reinforce_pp_baseline(rewards, np.arange(n) // g, mask)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_mask_holes_skip_the_discount_instead_of_resetting_the_return():
    """A tool observation (mask 0 inside the row) does not zero the return of the tokens before it (verl's
    reset would); the discount counts trained tokens only."""
    mask = jnp.array([[1, 1, 0, 1], [1, 1, 1, 1]], bool)
    adv = np.asarray(reinforce_pp_advantages(jnp.array([1.0, 0.0]), mask, gamma=0.5))
    returns = np.array([[0.25, 0.5, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])  # row 0: 2, 1, -, 0 tokens after
    m = np.asarray(mask, float)
    np.testing.assert_allclose(adv, _verl_whiten(returns, m) * m, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [lambda r, m: reinforce_pp_advantages(r, m, gamma=0.9),
                                lambda r, m: reinforce_pp_baseline_advantages(r, 4, m)],
                         ids=["rf++", "baseline"])
def test_padding_and_permutation_invariance(fn):
    rng = np.random.default_rng(3)
    rewards = jnp.asarray(rng.normal(size=8), jnp.float32)
    mask = _prefix_mask(rng.integers(1, 6, size=8), 6)
    padded = np.concatenate([mask, np.zeros((8, 4), bool)], axis=1)
    base = fn(rewards, jnp.asarray(mask))
    np.testing.assert_allclose(fn(rewards, jnp.asarray(padded))[:, :6], base, rtol=1e-6, atol=1e-7)
    perm = np.array([1, 0, 3, 2, 7, 6, 5, 4])  # within groups of 4
    np.testing.assert_allclose(fn(rewards[perm], jnp.asarray(mask[perm])), np.asarray(base)[perm],
                               rtol=1e-6, atol=1e-7)


def test_nan_rewards_and_empty_rows():
    mask = jnp.asarray(_prefix_mask([2, 2, 0, 3], 3))
    rewards = jnp.array([1.0, jnp.nan, 0.5, 0.0])
    for adv in (reinforce_pp_advantages(rewards, mask, nan_aware=True),
                reinforce_pp_baseline_advantages(rewards, 2, mask, nan_aware=True)):
        assert np.isfinite(adv).all()
        np.testing.assert_array_equal(np.asarray(adv)[1:3], 0.0)  # NaN reward, empty row
    # NaN rows leave the statistics: same as dropping the row
    kept = reinforce_pp_advantages(jnp.array([1.0, 0.0]), jnp.asarray(_prefix_mask([2, 3], 3)))
    got = reinforce_pp_advantages(rewards, mask, nan_aware=True)
    np.testing.assert_allclose(np.asarray(got)[[0, 3]], kept, rtol=1e-6)


def test_bad_inputs():
    mask = jnp.ones((4, 3), bool)
    with pytest.raises(ValueError, match="gamma"):
        reinforce_pp_advantages(jnp.zeros(4), mask, gamma=1.5)
    with pytest.raises(ValueError, match="multiple of group_size"):
        reinforce_pp_baseline_advantages(jnp.zeros(4), 3, mask)
    with pytest.raises(AssertionError):
        reinforce_pp_advantages(jnp.zeros(5), mask)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        rng = np.random.default_rng(5)
        rewards = jnp.asarray(rng.normal(size=8), jnp.float32)
        mask = jnp.asarray(_prefix_mask(rng.integers(1, 6, size=8), 6))
        rf = self.variant(lambda r, m: reinforce_pp_advantages(r, m, gamma=0.9))
        base = self.variant(lambda r, m: reinforce_pp_baseline_advantages(r, 4, m))
        np.testing.assert_allclose(rf(rewards, mask), reinforce_pp_advantages(rewards, mask, gamma=0.9),
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(base(rewards, mask), reinforce_pp_baseline_advantages(rewards, 4, mask),
                                   rtol=1e-6, atol=1e-7)


def test_registered_as_algorithms():
    from jaxrl.algorithms import ALGORITHMS, ESTIMATOR_ONLY, AlgoSettings, ReinforcePPParams
    from jaxrl.config import AlgorithmConfig, load_config
    from jaxrl.errors import ConfigError

    rng = np.random.default_rng(6)
    rewards_BR = rng.normal(size=(8, 2)).astype(np.float32)
    weights_R = np.array([1.0, 0.5], np.float32)
    mask = _prefix_mask(rng.integers(1, 6, size=8), 6)
    section = AlgorithmConfig(name="reinforce_pp")
    s = AlgoSettings(group_size=4, eps=1e-6, clip_low=0.2, clip_high=0.28, section=section,
                     params=ReinforcePPParams())
    r_B = jnp.asarray(rewards_BR @ weights_R)
    out = ALGORITHMS["reinforce_pp"].advantages(rewards_BR, weights_R, mask, s)
    expected = reinforce_pp_advantages(r_B, jnp.asarray(mask))
    np.testing.assert_allclose(out.adv_BT, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.clip_high_B, 0.28)
    out = ALGORITHMS["reinforce_pp_baseline"].advantages(rewards_BR, weights_R, mask, s)
    np.testing.assert_allclose(out.adv_BT, reinforce_pp_baseline_advantages(r_B, 4, jnp.asarray(mask)),
                               rtol=1e-5, atol=1e-6)
    assert {"reinforce_pp", "reinforce_pp_baseline"} <= set(ESTIMATOR_ONLY)
    cfg = load_config(None, ["algorithm.name=reinforce_pp", "algorithm.params.gamma=0.9"])
    assert cfg.algorithm.params == {"gamma": 0.9}
    with pytest.raises(ConfigError, match="algorithm.params.gamma"):
        load_config(None, ["algorithm.name=reinforce_pp", "algorithm.params.gamma=1.5"])
