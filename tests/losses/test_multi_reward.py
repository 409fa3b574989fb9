"""Tests for jaxrl.losses.research.multi_reward: spec 7h worked example, float64 references of each factor."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses.research.multi_reward import (RewardStats, combine_rewards, redundancy_factor,
                                               reference_frozen_normalize, reference_stats, risk_factor,
                                               tri_factor_weights, weakness_factor, weighted_sum)

SPEC_STATS = RewardStats(jnp.array([0.5, 3.0]), jnp.array([0.2, 1.0]))


def test_spec_7h_example():
    r = jnp.array([[0.7, 2.0]])
    norm = reference_frozen_normalize(r, SPEC_STATS, eps=0.0)
    np.testing.assert_allclose(norm, [[1.0, -1.0]], rtol=1e-6)
    combined, metrics = combine_rewards(r, SPEC_STATS, weights_R=jnp.array([0.6, 0.4]), eps=0.0)
    np.testing.assert_allclose(combined, [0.2], rtol=1e-5)
    np.testing.assert_allclose(metrics["reward/weight_0"], 0.6, rtol=1e-6)


def test_weighted_sum_and_shape_error():
    np.testing.assert_allclose(weighted_sum(jnp.array([[1.0, 2.0], [3.0, -1.0]]), [0.5, 2.0]), [4.5, -0.5])
    with pytest.raises(ValueError, match="weights_R must have shape \\(2,\\)"):
        weighted_sum(jnp.ones((3, 2)), [1.0])


def _random(seed, n=40):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=n)
    r = np.stack([a, 0.9 * a + 0.1 * rng.normal(size=n), rng.normal(2.0, 3.0, size=n)], 1)
    return r.astype(np.float32)


def test_reference_stats_are_frozen_and_match_numpy():
    ref = _random(0)
    stats = reference_stats(jnp.asarray(ref))
    np.testing.assert_allclose(stats.mean_R, ref.astype(np.float64).mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.std_R, ref.astype(np.float64).std(0, ddof=1), rtol=1e-5)
    shifted = _random(1) + 5.0  # the policy drifts; the normaliser does not
    expected = (shifted - np.asarray(stats.mean_R)) / (np.asarray(stats.std_R) + 1e-6)
    np.testing.assert_allclose(reference_frozen_normalize(jnp.asarray(shifted), stats), expected, rtol=1e-5)


def test_default_factors_match_float64_reference():
    norm = _random(2).astype(np.float64)
    weak = np.exp(-2.0 * norm.mean(0))
    weak /= weak.sum()
    corr = np.abs(np.corrcoef(norm.T))
    np.fill_diagonal(corr, 0.0)
    red = 1.0 - corr.max(1)
    risk = np.array([3.0, 2.0, 1.0]) / 6.0
    expected = weak * red * risk / (weak * red * risk).sum()
    got = tri_factor_weights(jnp.asarray(norm, jnp.float32),
                             (weakness_factor(2.0), redundancy_factor(), risk_factor([3.0, 2.0, 1.0])))
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    np.testing.assert_allclose(jnp.sum(got), 1.0, rtol=1e-6)
    # rewards 0 and 1 are near-duplicates: with the redundancy factor alone both weigh less than reward 2
    red_only = tri_factor_weights(jnp.asarray(norm, jnp.float32), (redundancy_factor(),))
    assert red_only[2] > 2 * red_only[0] and red_only[2] > 2 * red_only[1]


def test_constant_reward_and_single_reward_edge_cases():
    norm = jnp.stack([jnp.zeros(5), jnp.arange(5.0)], 1)
    red = redundancy_factor()(norm)
    np.testing.assert_allclose(red, [1.0, 1.0])
    np.testing.assert_allclose(redundancy_factor()(jnp.ones((4, 1))), [1.0])
    w = tri_factor_weights(norm, (lambda x: jnp.zeros(2),))
    np.testing.assert_allclose(w, [0.5, 0.5])


def test_combine_rewards_adaptive_default():
    r = jnp.asarray(_random(3))
    stats = reference_stats(jnp.asarray(_random(4)))
    combined, metrics = combine_rewards(r, stats)
    norm = reference_frozen_normalize(r, stats)
    w = tri_factor_weights(norm, (weakness_factor(), redundancy_factor()))
    np.testing.assert_allclose(combined, np.asarray(norm) @ np.asarray(w), rtol=1e-5, atol=1e-6)
    assert set(metrics) == {"reward/weight_0", "reward/weight_1", "reward/weight_2"}


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        r = jnp.asarray(_random(5))
        stats = reference_stats(jnp.asarray(_random(6)))
        fn = lambda x: combine_rewards(x, stats, factors=(weakness_factor(), redundancy_factor(),
                                                          risk_factor([1.0, 1.0, 2.0])))
        chex.assert_trees_all_close(self.variant(fn)(r), fn(r), rtol=1e-5, atol=1e-6)
