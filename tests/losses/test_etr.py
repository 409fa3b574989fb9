"""Tests for jaxrl.losses.etr: spec 2 worked example, exact GRPO equality at alpha = beta = 0, reference."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import (ETRConfig, etr_clip_bounds, etr_policy_loss, group_advantages, group_reward_std,
                          policy_loss)

SPEC_CFG = ETRConfig(clip_low=0.2, clip_high=0.28, alpha=0.1, beta=0.5)


def _spec_inputs():
    r = jnp.array([1.0, 0.0, 0.0, 0.0])
    return group_advantages(r, 4, eps=0.0), group_reward_std(r, 4)


def test_spec_example_bounds():
    adv, std = _spec_inputs()
    np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5], rtol=1e-6)
    np.testing.assert_allclose(std, [0.5] * 4, rtol=1e-6)
    lo, hi = etr_clip_bounds(adv, std, SPEC_CFG)
    np.testing.assert_allclose(lo / 0.2, [1.4375, 1.3125, 1.3125, 1.3125], rtol=1e-6)
    np.testing.assert_allclose(lo, [0.2875, 0.2625, 0.2625, 0.2625], rtol=1e-6)
    np.testing.assert_allclose(hi, [0.4025, 0.3675, 0.3675, 0.3675], rtol=1e-6)


def test_spec_example_winner_loss_and_gradient():
    adv, std = _spec_inputs()
    logp = jnp.log(jnp.full((4, 1), 1.35))
    mask = jnp.array([[1], [0], [0], [0]])
    etr = lambda lp: etr_policy_loss(lp, jnp.zeros_like(lp), adv, std, mask, SPEC_CFG)[0]
    grpo = lambda lp: policy_loss(lp, jnp.zeros_like(lp), adv, mask, clip_low=0.2, clip_high=0.28)[0]
    np.testing.assert_allclose(grpo(logp), -1.92, rtol=1e-6)
    np.testing.assert_allclose(etr(logp), -2.025, rtol=1e-6)
    assert jax.grad(grpo)(logp)[0, 0] == 0.0  # clipped in GRPO
    np.testing.assert_allclose(jax.grad(etr)(logp)[0, 0], -1.5 * 1.35, rtol=1e-6)  # alive inside ETR region


def _random(seed, p=3, g=4, t=6):
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 2, size=p * g).astype(np.float32)
    r[:g] = 1.0  # zero-variance group
    old = rng.normal(-1.5, 0.5, size=(p * g, t))
    logp = old + rng.normal(0, 0.4, size=(p * g, t))
    mask = np.arange(t)[None] < rng.integers(0, t + 1, size=(p * g, 1))
    f = lambda x: jnp.asarray(x, jnp.float32)
    return jnp.asarray(r), f(logp), f(old), jnp.asarray(mask)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_zero_coefficients_equal_grpo_bit_for_bit(agg):
    r, logp, old, mask = _random(0)
    adv, std = group_advantages(r, 4), group_reward_std(r, 4)
    cfg = ETRConfig(clip_low=0.2, clip_high=0.28, alpha=0.0, beta=0.0)
    for wrap in (lambda f: f, jax.jit):
        etr = wrap(lambda lp: etr_policy_loss(lp, old, adv, std, mask, cfg, agg=agg, dual_clip=3.0)[0])
        grpo = wrap(lambda lp: policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg=agg,
                                           dual_clip=3.0)[0])
        assert etr(logp) == grpo(logp)
        np.testing.assert_array_equal(jax.grad(etr)(logp), jax.grad(grpo)(logp))


def test_bounds_match_reference_with_cap_and_pluggable_factors():
    rng = np.random.default_rng(1)
    adv = rng.normal(0, 2, size=10).astype(np.float32)
    std = rng.uniform(0, 0.6, size=10).astype(np.float32)
    cfg = ETRConfig(clip_low=0.2, clip_high=0.3, alpha=0.5, beta=2.0, adv_cap=2.0, clip_low_max=0.5)
    scale = (1 + 0.5 * np.minimum(np.abs(adv), 2.0)) * (1 + 2.0 * std)
    lo, hi = etr_clip_bounds(jnp.asarray(adv), jnp.asarray(std), cfg)
    np.testing.assert_allclose(lo, np.minimum(0.2 * scale, 0.5), rtol=1e-6)
    np.testing.assert_allclose(hi, 0.3 * scale, rtol=1e-6)
    assert np.any(np.asarray(lo) == 0.5)  # cap binds
    lo2, hi2 = etr_clip_bounds(jnp.asarray(adv), jnp.asarray(std), cfg, micro_fn=lambda a: 1 + a ** 2,
                               macro_fn=lambda s: jnp.exp(s))
    np.testing.assert_allclose(hi2, 0.3 * (1 + adv.astype(np.float64) ** 2) * np.exp(std), rtol=1e-5)


def test_group_reward_std_matches_numpy():
    r, *_ = _random(2)
    ref = np.repeat(np.asarray(r, np.float64).reshape(-1, 4).std(1, ddof=1), 4)
    np.testing.assert_allclose(group_reward_std(r, 4), ref, rtol=1e-6)
    np.testing.assert_array_equal(group_reward_std(r, 1), np.zeros(12))


def test_finite_gradients_with_fully_masked_rows():
    r, logp, old, mask = _random(3)
    mask = mask.at[5].set(False)
    adv, std = group_advantages(r, 4), group_reward_std(r, 4)
    g = jax.grad(lambda lp: etr_policy_loss(lp, old, adv, std, mask, SPEC_CFG)[0])(logp)
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[5] == 0.0)


def test_bad_config():
    with pytest.raises(ValueError, match="clip_low_max < 1"):
        ETRConfig(clip_low=0.2, clip_low_max=1.0)
    with pytest.raises(ValueError, match="alpha, beta must be >= 0"):
        ETRConfig(alpha=-1.0)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        r, logp, old, mask = _random(4)
        adv, std = group_advantages(r, 4), group_reward_std(r, 4)
        fn = lambda lp: etr_policy_loss(lp, old, adv, std, mask, SPEC_CFG)
        chex.assert_trees_all_close(self.variant(fn)(logp), fn(logp), rtol=1e-6)
