"""Tests for jaxrl.losses.kl: spec 1.9 numbers, float64 reference with verl clamps, straight-through
gradients."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import KLKind, kl_loss, kl_penalty


def _np_kl(logp, ref, kind):
    d = np.asarray(logp, np.float64) - np.asarray(ref, np.float64)
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "abs":
        return np.abs(d)
    nd = np.clip(-d, -20, 20)
    return np.clip(np.exp(nd) - nd - 1, -10, 10)


@pytest.mark.parametrize("kind,expected", [("k1", 0.2), ("k2", 0.02), ("k3", 0.018731), ("abs", 0.2)])
def test_spec_worked_example(kind, expected):
    got = kl_penalty(jnp.full((1, 1), -1.0), jnp.full((1, 1), -1.2), kind)
    np.testing.assert_allclose(got, [[expected]], rtol=2e-5)


@pytest.mark.parametrize("kind", [k.value for k in KLKind])
def test_matches_float64_reference_with_clamps(kind):
    rng = np.random.default_rng(0)
    logp = rng.normal(-2, 1, size=(4, 6))
    ref = logp + rng.normal(0, 0.5, size=(4, 6))
    logp[0, 0], logp[1, 1], logp[2, 2] = ref[0, 0] + 40.0, ref[1, 1] - 40.0, ref[2, 2] - 3.0  # clamps bind
    got = kl_penalty(jnp.asarray(logp, jnp.float32), jnp.asarray(ref, jnp.float32), KLKind(kind))
    np.testing.assert_allclose(got, _np_kl(logp, ref, kind), rtol=1e-5, atol=1e-5)
    if kind == "k3":
        assert float(got[1, 1]) == 10.0 and np.all(np.asarray(got) >= 0.0)


@pytest.mark.parametrize("kind", ["k1", "k3", "abs"])
def test_straight_through_value_of_kind_gradient_of_k2(kind):
    logp = jnp.array([[-1.0, -0.3, -2.5]])
    ref = jnp.array([[-1.2, -0.9, -1.0]])
    value, grad = jax.value_and_grad(lambda x: kl_penalty(x, ref, kind, straight_through=True).sum())(logp)
    np.testing.assert_allclose(value, kl_penalty(logp, ref, kind).sum(), rtol=1e-6)
    np.testing.assert_allclose(grad, logp - ref, rtol=1e-6)  # d(d^2/2)/d logp = d
    plain = jax.grad(lambda x: kl_penalty(x, ref, kind).sum())(logp)
    assert not np.allclose(plain, grad)


def test_k3_gradient_and_reference_gets_none():
    logp = jnp.array([[-1.0, -0.5]])
    ref = jnp.array([[-1.2, -0.1]])
    g_logp, g_ref = jax.grad(lambda a, b: kl_penalty(a, b, "k3").sum(), argnums=(0, 1))(logp, ref)
    np.testing.assert_allclose(g_logp, 1.0 - np.exp(-(logp - ref)), rtol=1e-6)  # d/dd (e^-d + d - 1)
    assert np.all(np.asarray(g_ref) == 0.0)
    jax.test_util.check_grads(lambda a: kl_penalty(a, ref, "k3"), (logp,), order=2, modes=["rev"])


def test_kl_loss_aggregates_and_reports_metric():
    logp = jnp.array([[-1.0, -1.0, 0.0], [-1.0, 5.0, 5.0]])
    ref = jnp.array([[-1.2, -1.2, 0.0], [-1.2, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0]])
    term, metrics = kl_loss(logp, ref, mask, coef=0.1, kind="k1")
    np.testing.assert_allclose(term, 0.1 * 0.2, rtol=1e-5)
    np.testing.assert_allclose(metrics["kl/k1"], 0.2, rtol=1e-5)
    g = jax.grad(lambda x: kl_loss(x, ref, jnp.zeros_like(mask), coef=0.1)[0])(logp)
    assert np.all(np.asarray(g) == 0.0)


def test_unknown_kind():
    with pytest.raises(ValueError, match="allowed: 'k1', 'k2', 'k3', 'abs'"):
        kl_penalty(jnp.zeros((1, 1)), jnp.zeros((1, 1)), "low_var_kl")


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        logp = jnp.linspace(-3, 0, 12).reshape(3, 4)
        ref = jnp.linspace(-2, -1, 12).reshape(3, 4)
        for kind in ("k1", "k2", "k3", "abs"):
            for st in (False, True):
                fn = lambda a, b: kl_penalty(a, b, kind, straight_through=st)
                np.testing.assert_allclose(self.variant(fn)(logp, ref), fn(logp, ref), rtol=1e-6)
