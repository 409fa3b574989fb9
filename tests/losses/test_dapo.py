"""Tests for jaxrl.losses.dapo: overlong shaping against a hand computation and a numpy reference."""

import dataclasses

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import DAPOConfig, overlong_penalty, overlong_shaped_rewards, policy_loss


def test_overlong_penalty_hand_values():
    # L_max=8192, L_buf=4096: free up to 4096 tokens, -0.5 at 6144, -1 at 8192.
    got = overlong_penalty(jnp.array([100, 4096, 6144, 8192]), max_length=8192, buffer=4096)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0], atol=0)
    np.testing.assert_allclose(overlong_penalty(jnp.array([7]), max_length=10, buffer=4, factor=2.0), [-0.5])


def test_overlong_penalty_matches_reference():
    lengths = np.random.default_rng(0).integers(0, 1025, size=50)
    ref = np.minimum(-(lengths - (1024 - 256)) / 256 * 0.5, 0.0)
    got = overlong_penalty(jnp.asarray(lengths), max_length=1024, buffer=256, factor=0.5)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_shaped_rewards_and_config():
    cfg = DAPOConfig(overlong_max_length=10, overlong_buffer=4)
    got = overlong_shaped_rewards(jnp.array([1.0, 1.0, 0.0]), jnp.array([3, 8, 10]), cfg)
    np.testing.assert_allclose(got, [1.0, 0.5, -1.0], rtol=1e-6)
    assert dataclasses.asdict(cfg.clip()) == {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 10.0}
    logp = jnp.log(jnp.array([[1.3]]))
    loss, _ = policy_loss(logp, jnp.zeros((1, 1)), jnp.array([0.5]), jnp.ones((1, 1)),
                          **dataclasses.asdict(cfg.clip()), agg=cfg.agg)
    np.testing.assert_allclose(loss, -0.64, rtol=1e-6)  # spec 1.9 clip-higher example


def test_bad_config():
    with pytest.raises(ValueError, match="overlong_buffer must be in"):
        DAPOConfig(overlong_max_length=100, overlong_buffer=200)
    with pytest.raises(ValueError, match="clip_low"):
        DAPOConfig(clip_low=1.5)
    with pytest.raises(ValueError, match="buffer must be in"):
        overlong_penalty(jnp.array([1]), max_length=4, buffer=0)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        lengths = jnp.arange(0, 20, 3)
        fn = lambda x: overlong_penalty(x, max_length=16, buffer=8)
        np.testing.assert_allclose(self.variant(fn)(lengths), fn(lengths), rtol=1e-7)
