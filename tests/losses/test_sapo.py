"""Tests for jaxrl.losses.sapo: spec algorithms-2 §3 table, float64 reference, jit, gradients, and agreement
with TRL 1.16 (`loss_type="sapo"`)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import sapo_loss, sapo_objective

# Spec §3 table (torch autograd, tau_pos=1, tau_neg=1.05): r -> (f, dl/dlogp) for A=+1 and A=-1, gate weight.
SPEC = [
    (0.5, 1.510163, -0.470007, 1.415938, 0.467070, 0.940015),
    (0.8, 1.800664, -0.792053, 1.705494, 0.791244, 0.990066),
    (1.0, 2.000000, -1.000000, 1.904762, 1.000000, 1.000000),
    (1.2, 2.199336, -1.188080, 2.104030, 1.186867, 0.990066),
    (2.0, 2.924234, -1.572895, 2.822000, 1.536220, 0.786448),
    (4.0, 3.810297, -0.722827, 3.652986, 0.630445, 0.180707),
]


def _np_sapo(logp, old, adv, mask, tp=1.0, tn=1.05):
    """float64 seq-mean-token-mean reference: (loss, d loss / d logp)."""
    logp, old, adv, m = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
    r = np.exp(np.clip(np.where(m > 0, logp - old, 0.0), -20, 20))
    tau = np.where(adv > 0, tp, tn)
    sig = 1.0 / (1.0 + np.exp(-tau * (r - 1.0)))
    lens = m.sum(1)
    w = m / np.maximum(lens, 1)[:, None] / max((lens > 0).sum(), 1)
    loss = (w * -(4.0 / tau) * sig * adv).sum()
    grad = w * -adv * r * 4.0 * sig * (1.0 - sig)
    return loss, grad


def _random_inputs(seed, b=6, t=5):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, size=(b, t))
    logp = old + rng.normal(0.0, 0.6, size=(b, t))
    lens = rng.integers(1, t + 1, size=b)
    lens[0] = 0
    mask = np.arange(t)[None] < lens[:, None]
    adv = rng.normal(size=(b, t))
    adv[3] = 0.0
    return logp, old, adv, mask


def test_spec_table_gate_and_gradient():
    r = np.array([row[0] for row in SPEC])
    logp = np.log(np.stack([r, r]))  # 2 x 6: row 0 A=+1, row 1 A=-1
    adv = np.array([[1.0] * 6, [-1.0] * 6])
    with jax.enable_x64(True):
        a = [jnp.asarray(x) for x in (logp, np.zeros_like(logp), adv, np.ones_like(logp, bool))]
        loss_BT, _ = sapo_objective(*a)
        grad = jax.grad(lambda lp: jnp.sum(sapo_objective(lp, *a[1:])[0]))(a[0])
    spec = np.array(SPEC)
    np.testing.assert_allclose(loss_BT[0], -spec[:, 1], atol=1e-6)   # loss = -f A
    np.testing.assert_allclose(loss_BT[1], spec[:, 3], atol=1e-6)
    np.testing.assert_allclose(grad[0], spec[:, 2], atol=1e-6)
    np.testing.assert_allclose(grad[1], spec[:, 4], atol=1e-6)
    _, m = sapo_objective(*(jnp.asarray(x[:1], jnp.float32) for x in (logp, np.zeros_like(logp), adv)),
                          jnp.ones((1, 6), bool))
    np.testing.assert_allclose(m["sapo/gate_mean"], spec[:, 5].mean(), rtol=1e-5)


def test_on_policy_equals_policy_gradient():
    """At r = 1 the gradient is -A (REINFORCE) whatever the temperature; the value is -2A/tau."""
    adv = jnp.array([[0.7, -1.3, 2.0]])
    logp = jnp.array([[-0.5, -1.5, -2.5]])
    fn = lambda lp: jnp.sum(sapo_objective(lp, logp, adv, jnp.ones((1, 3)), tau_pos=3.0, tau_neg=7.0)[0])
    np.testing.assert_allclose(jax.grad(fn)(logp), -adv, rtol=1e-6)
    np.testing.assert_allclose(fn(logp), -2 * (0.7 / 3.0 - 1.3 / 7.0 + 2.0 / 3.0), rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_float64_reference(seed):
    logp, old, adv, mask = _random_inputs(seed)
    logp = np.where(mask, logp, np.nan)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    fn = lambda lp: sapo_loss(lp, f32(old), f32(adv), jnp.asarray(mask))[0]
    loss, grad = jax.value_and_grad(fn)(f32(logp))
    ref_loss, ref_grad = _np_sapo(logp, old, adv, mask)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_huge_ratio_gives_finite_zero_gradient():
    logp = jnp.array([[60.0, -0.1]])
    g = jax.grad(lambda lp: sapo_loss(lp, jnp.zeros((1, 2)), jnp.ones((1, 2)), jnp.ones((1, 2)))[0])(logp)
    assert np.all(np.isfinite(g)) and g[0, 0] == 0.0 and g[0, 1] != 0.0


def test_check_grads_and_fully_masked_batch():
    logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_inputs(4))
    fn = lambda lp: sapo_loss(lp, old, adv, mask)[0]
    jax.test_util.check_grads(fn, (logp,), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)
    g0 = jax.grad(lambda lp: sapo_loss(lp, old, adv, jnp.zeros_like(mask))[0])(logp)
    assert np.all(np.asarray(g0) == 0.0)


def test_bad_temperature_raises():
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="tau_pos and tau_neg must be > 0"):
        sapo_objective(x, x, x, x, tau_neg=0.0)


@pytest.mark.parametrize("taus", [(1.0, 1.05), (2.0, 10.0)])
def test_agrees_with_trl_sapo(taus):
    oracle = pytest.importorskip("_trl_oracle")
    logp, old, adv, mask = _random_inputs(5)
    keep = mask.any(1)  # TRL averages over all B rows, jaxrl over non-empty ones: compare without them
    logp, old, adv, mask = logp[keep], old[keep], adv[keep], mask[keep]
    trl_loss, trl_grad, _ = oracle.trl_compute_loss(logp, old, adv, mask, loss_type="sapo",
                                                    sapo_temperature_pos=taus[0],
                                                    sapo_temperature_neg=taus[1])
    # TRL builds its temperatures with torch.where on Python floats, i.e. in float32 (1.05 -> 1.04999995):
    # give jaxrl the same rounded values so the comparison can be exact.
    taus = tuple(float(np.float32(t)) for t in taus)
    with jax.enable_x64(True):
        a = [jnp.asarray(x) for x in (logp, old, adv, mask)]
        fn = lambda lp: sapo_loss(lp, *a[1:], tau_pos=taus[0], tau_neg=taus[1])[0]
        loss, grad = jax.value_and_grad(fn)(a[0])
    np.testing.assert_allclose(loss, trl_loss, rtol=1e-12)
    np.testing.assert_allclose(grad, trl_grad, rtol=1e-12, atol=1e-15)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_inputs(6))
        fn = lambda a, b, c, d: sapo_loss(a, b, c, d)
        args = (logp, old, adv, mask)
        chex.assert_trees_all_close(self.variant(fn)(*args), fn(*args), rtol=1e-6)
