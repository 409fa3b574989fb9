"""AFRL mode-balanced objective (spec 7g, [READING])."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import sft


def test_spec_example():
    loss, metrics = sft.mode_balanced_loss(jnp.float32(0.35), jnp.float32(1.2), 0.1)
    np.testing.assert_allclose(loss, 0.47, rtol=1e-6)
    np.testing.assert_allclose(metrics["afrl/sft_nll"], 1.2, rtol=1e-6)


def test_hand_computed_2x3():
    logp = jnp.log(jnp.array([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
    mask = jnp.array([[1, 1, 0], [1, 0, 0]])
    want = -(np.log(0.5) + np.log(0.25) + np.log(0.1)) / 3
    np.testing.assert_allclose(sft.sft_nll(logp, mask), want, rtol=1e-6)


def test_matches_float64_reference_and_padding_invariance():
    rng = np.random.default_rng(0)
    logp = -rng.exponential(size=(4, 7))
    mask = rng.integers(0, 2, size=(4, 7))
    mask[2] = 0
    want = -(logp * mask).sum() / mask.sum()
    got = sft.sft_nll(jnp.asarray(logp, jnp.float32), jnp.asarray(mask))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    padded = sft.sft_nll(jnp.pad(jnp.asarray(logp, jnp.float32), ((0, 0), (0, 3)), constant_values=-1e30),
                         jnp.pad(jnp.asarray(mask), ((0, 0), (0, 3))))
    np.testing.assert_allclose(padded, got, rtol=1e-7)


def test_fully_masked_gives_zero_and_finite_gradient():
    logp = jnp.array([[-jnp.inf, -1.0], [-2.0, -3.0]])
    mask = jnp.zeros((2, 2))
    assert float(sft.sft_nll(logp, mask)) == 0.0
    g = jax.grad(lambda x: sft.sft_nll(x, jnp.array([[0, 1], [1, 0]])))(logp)
    np.testing.assert_array_equal(g, [[0.0, -0.5], [-0.5, 0.0]])


def test_negative_lambda_is_rejected():
    with pytest.raises(ValueError, match="lam=-0.1"):
        sft.mode_balanced_loss(jnp.float32(0.0), jnp.float32(0.0), -0.1)


class VariantsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        logp = jnp.log(jnp.array([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
        mask = jnp.array([[1, 1, 0], [1, 0, 0]])
        got = self.variant(lambda a, b: sft.mode_balanced_loss(jnp.float32(0.35), sft.sft_nll(a, b), 0.1)[0])(
            logp, mask)
        want = 0.35 + 0.1 * -(np.log(0.5) + np.log(0.25) + np.log(0.1)) / 3
        np.testing.assert_allclose(got, want, rtol=1e-6)
