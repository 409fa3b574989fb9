"""Tests for jaxrl.losses.cispo: spec algorithms-2 §2 table, float64 reference, the two libraries' bounds,
jit, gradients, and agreement with TRL 1.16 (`loss_type="cispo"`)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import CISPOConfig, cispo_loss, cispo_objective

# Spec §2 table: ratios r, advantages A, log-prob -0.7; expected weights per parameterisation.
R, A = np.array([1.5, 0.5, 1.0]), np.array([1.0, -1.0, 1.0])
TABLE = [
    (CISPOConfig.verl(), [1.2, 0.8, 1.0]),                  # verl default 0.2 / 0.2
    (CISPOConfig.verl(10.0, 0.2), [1.2, 0.5, 1.0]),         # verl recipe: no lower bound, cap 1.2
    (CISPOConfig.trl(5.0), [1.5, 0.5, 1.0]),                # TRL / ScaleRL cap 5
    (CISPOConfig.trl(0.2), [0.2, 0.2, 0.2]),                # TRL default epsilon_high -> 0.2 (the pitfall)
]


def _np_cispo(logp, old, adv, mask, w_min, w_max):
    """float64 token-mean reference: (loss, d loss / d logp)."""
    logp, old, adv, m = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
    r = np.exp(np.clip(np.where(m > 0, logp - old, 0.0), -20, 20))
    w = np.clip(r, -np.inf if w_min is None else w_min, w_max)
    n = max(m.sum(), 1.0)
    return (-w * adv * np.where(m > 0, logp, 0.0) * m).sum() / n, -w * adv * m / n


def _random_inputs(seed, b=6, t=5):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, size=(b, t))
    logp = old + rng.normal(0.0, 0.5, size=(b, t))
    lens = rng.integers(1, t + 1, size=b)
    lens[2] = 0
    mask = np.arange(t)[None] < lens[:, None]
    return logp, old, rng.normal(size=(b, t)), mask


@pytest.mark.parametrize("cfg,weights", TABLE)
def test_spec_table_2x3(cfg, weights):
    old = np.array([[-0.7 - np.log(1.5), -0.7 - np.log(0.5), -0.7], [-1.0, -1.0, -1.0]])
    logp = np.array([[-0.7, -0.7, -0.7], [-0.9, -1.1, -5.0]])
    mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    adv = np.array([A, [0.5, 0.5, 0.5]])
    with jax.enable_x64(True):
        a = [jnp.asarray(x) for x in (logp, old, adv, mask)]
        loss_BT, metrics = cispo_objective(*a, w_max=cfg.w_max, w_min=cfg.w_min)
        per_tok = lambda lp: cispo_objective(lp, *a[1:], w_max=cfg.w_max, w_min=cfg.w_min)[0]
        grad = jax.grad(lambda lp: jnp.sum(per_tok(lp)))(a[0])
        loss_BT, grad = np.asarray(loss_BT), np.asarray(grad)
    w = np.asarray(weights)
    np.testing.assert_allclose(loss_BT[0], w * A * 0.7, rtol=1e-12)  # -w A logp with logp = -0.7
    np.testing.assert_allclose(grad[0], -w * A, rtol=1e-12)          # d l / d logp = -w A
    assert loss_BT[1, 2] == 0.0 and grad[1, 2] == 0.0
    if cfg.w_max == 1.2 and cfg.w_min == 0.8:
        np.testing.assert_allclose(loss_BT[0, 0], 0.84, rtol=1e-12)  # spec: verl default, token 1
        # r = 1.5 and 0.5 are outside [0.8, 1.2]; row 1's ratios exp(+-0.1) are inside.
        np.testing.assert_allclose(metrics["cispo/clip_frac"], 2 / 5, rtol=1e-6)  # metrics are float32


def test_keeps_gradient_where_ppo_clip_zeroes_it():
    """Spec table: PPO with eps 0.2 gives 0 gradient at (r=1.5, A=+1) and (r=0.5, A=-1); CISPO does not."""
    logp = jnp.log(jnp.array([[1.5, 0.5]]))
    g = jax.grad(lambda lp: cispo_loss(lp, jnp.zeros((1, 2)), jnp.array([[1.0, -1.0]]), jnp.ones((1, 2)),
                                       w_max=1.2, w_min=0.8, agg="seq-mean-token-sum")[0])(logp)
    np.testing.assert_allclose(g, [[-1.2, 0.8]], rtol=1e-6)


@pytest.mark.parametrize("w_min,w_max", [(None, 1.2), (0.8, 1.2), (None, 5.0)])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_float64_reference(w_min, w_max, seed):
    logp, old, adv, mask = _random_inputs(seed)
    logp = np.where(mask, logp, np.nan)  # padding garbage must not leak
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    fn = lambda lp: cispo_loss(lp, f32(old), f32(adv), jnp.asarray(mask), w_max=w_max, w_min=w_min)[0]
    loss, grad = jax.value_and_grad(fn)(f32(logp))
    ref_loss, ref_grad = _np_cispo(logp, old, adv, mask, w_min, w_max)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_metrics():
    logp, old, adv, mask = _random_inputs(3)
    _, m = cispo_objective(*(jnp.asarray(x, jnp.float32) for x in (logp, old, adv)), jnp.asarray(mask),
                           w_max=1.2, w_min=0.8)
    r = np.exp(logp - old)
    v = mask
    np.testing.assert_allclose(m["cispo/clip_frac"], ((r > 1.2) | (r < 0.8))[v].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["cispo/clip_frac_high"], ((r > 1.2) & (adv > 0))[v].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["cispo/weight_mean"], np.clip(r, 0.8, 1.2)[v].mean(), rtol=1e-5)
    np.testing.assert_allclose(m["pg/ratio_max"], r[v].max(), rtol=1e-5)


def test_check_grads_old_logp_and_advantages_constant_and_fully_masked():
    logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_inputs(4))
    # Finite differences also see how the weight moves with logp, which the stop-gradient removes by design;
    # with w_min = w_max the weight is constant and the two must agree.
    fn = lambda lp: cispo_loss(lp, old, adv, mask, w_max=0.7, w_min=0.7)[0]
    jax.test_util.check_grads(fn, (logp,), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)
    g_old, g_adv = jax.grad(lambda o, a: cispo_loss(logp, o, a, mask, w_max=1.2)[0], argnums=(0, 1))(old, adv)
    assert np.all(np.asarray(g_old) == 0.0) and np.all(np.asarray(g_adv) == 0.0)
    g0 = jax.grad(lambda lp: cispo_loss(lp, old, adv, jnp.zeros_like(mask), w_max=1.2)[0])(logp)
    assert np.all(np.asarray(g0) == 0.0)


def test_bounds_are_validated():
    with pytest.raises(ValueError, match="w_max must be > 0"):
        CISPOConfig(w_max=0.0)
    with pytest.raises(ValueError, match="w_min must be None or in"):
        CISPOConfig(w_max=1.2, w_min=1.5)
    with pytest.raises(TypeError):
        cispo_objective(*(jnp.zeros((1, 2)),) * 4)  # the cap is required: no silent default
    assert CISPOConfig.verl(10.0, 0.2) == CISPOConfig(w_max=1.2, w_min=None)


@pytest.mark.parametrize("epsilon_high", [5.0, 1.2, 0.2])
def test_agrees_with_trl_cispo(epsilon_high):
    oracle = pytest.importorskip("_trl_oracle")
    logp, old, adv, mask = _random_inputs(5)
    cfg = CISPOConfig.trl(epsilon_high)
    trl_loss, trl_grad, trl_metrics = oracle.trl_compute_loss(logp, old, adv, mask, loss_type="cispo",
                                                              epsilon_high=epsilon_high)
    with jax.enable_x64(True):
        a = [jnp.asarray(x) for x in (logp, old, adv, mask)]
        fn = lambda lp: cispo_loss(lp, *a[1:], w_max=cfg.w_max, w_min=cfg.w_min)
        (loss, m), grad = jax.value_and_grad(fn, has_aux=True)(a[0])
    np.testing.assert_allclose(loss, trl_loss, rtol=1e-12)
    np.testing.assert_allclose(grad, trl_grad, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(m["cispo/clip_frac_high"], trl_metrics["cispo_clip_ratio"][0], rtol=1e-12)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_inputs(6))
        fn = lambda a, b, c, d: cispo_loss(a, b, c, d, w_max=1.2, w_min=0.8)
        args = (logp, old, adv, mask)
        chex.assert_trees_all_close(self.variant(fn)(*args), fn(*args), rtol=1e-6)
