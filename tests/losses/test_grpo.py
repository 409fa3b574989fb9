"""Tests for jaxrl.losses.grpo.policy_loss / entropy_bonus: spec 1.9 clipping numbers, float64 reference,
padding and micro-batch invariances, gradients."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import ClipConfig, aggregation_normalizer, entropy_bonus, policy_loss

SPEC_CASES = [  # (A, rho, loss, clipped-zero-grad) with eps_low=0.2, eps_high=0.28, c=3 (spec 1.9)
    (0.5, 1.3, -0.64, True), (0.5, 1.1, -0.55, False), (0.5, 0.7, -0.35, False),
    (-1.5, 0.7, 1.2, True), (-1.5, 1.1, 1.65, False), (-1.5, 4.0, 4.5, True),
]


def _np_policy_loss(logp, old, adv, mask, lo, hi, c, level):
    logp, old, mask = (np.asarray(x, np.float64) for x in (logp, old, mask))
    b, t = logp.shape
    adv = np.broadcast_to(np.asarray(adv, np.float64).reshape(b, -1), (b, t))
    lo = np.broadcast_to(np.asarray(lo, np.float64).reshape(b, -1) if np.ndim(lo) else lo, (b, t))
    hi = np.broadcast_to(np.asarray(hi, np.float64).reshape(b, -1) if np.ndim(hi) else hi, (b, t))
    d = np.where(mask > 0, logp - old, 0.0)
    if level == "sequence":
        d = np.repeat((d.sum(1) / np.maximum(mask.sum(1), 1))[:, None], t, 1)
    rho = np.exp(np.clip(d, -20, 20))
    loss = np.maximum(-adv * rho, -adv * np.clip(rho, 1 - lo, 1 + hi))
    if c is not None:
        loss = np.where(adv < 0, np.minimum(loss, -adv * c), loss)
    n = max(mask.sum(), 1)
    metrics = {
        "pg/loss": (loss * mask).sum() / n,
        "pg/clip_frac_high": (((adv > 0) & (rho > 1 + hi)) * mask).sum() / n,
        "pg/clip_frac_low": (((adv < 0) & (rho < 1 - lo)) * mask).sum() / n,
        "pg/approx_kl": (-np.clip(d, -20, 20) * mask).sum() / n,
        "pg/ratio_mean": (rho * mask).sum() / n,
    }
    return metrics["pg/loss"], metrics


def _random_inputs(seed, b=6, t=5, huge=True):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, size=(b, t))
    logp = old + rng.normal(0.0, 0.3, size=(b, t))
    if huge:
        logp[2, 1] = old[2, 1] + 60.0  # huge ratio: log-ratio clamped at 20
        logp[3, 0] = old[3, 0] - 45.0
    lens = rng.integers(1, t + 1, size=b)
    lens[4] = 0  # all-padded row
    mask = np.arange(t)[None] < lens[:, None]
    mask[2, 1] = mask[3, 0] = True
    logp[~mask] = np.nan  # padding garbage must not leak
    adv = rng.normal(size=b)
    adv[5] = 0.0
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return f32(logp), f32(old), f32(adv), jnp.asarray(mask)


# compiled once for all SPEC_CASES: the advantage is an argument
_spec_loss = jax.jit(lambda lp, a: policy_loss(lp, jnp.zeros((1, 1)), a, jnp.ones((1, 1)),
                                               clip_low=0.2, clip_high=0.28, dual_clip=3.0)[0])
_spec_grad = jax.jit(jax.grad(_spec_loss))


@pytest.mark.parametrize("adv,rho,expected,zero_grad", SPEC_CASES)
def test_spec_clipping_examples(adv, rho, expected, zero_grad):
    logp = jnp.log(jnp.full((1, 1), rho))
    np.testing.assert_allclose(_spec_loss(logp, jnp.array([adv])), expected, rtol=1e-6)
    grad = _spec_grad(logp, jnp.array([adv]))[0, 0]
    assert (grad == 0.0) == zero_grad
    if not zero_grad:
        np.testing.assert_allclose(grad, -adv * rho, rtol=1e-6)  # d(-A rho)/d logp = -A rho


def test_spec_clip_fraction_metrics():
    adv = jnp.array([[a for a, *_ in SPEC_CASES]])
    logp = jnp.log(jnp.array([[r for _, r, *_ in SPEC_CASES]]))
    loss, metrics = policy_loss(logp, jnp.zeros_like(logp), adv, jnp.ones_like(logp),
                                clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    np.testing.assert_allclose(loss, np.mean([e for *_, e, _ in SPEC_CASES]), rtol=1e-6)
    np.testing.assert_allclose(metrics["pg/clip_frac"], 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics["pg/clip_frac_low"], 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics["pg/clip_frac_high"], 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics["pg/dual_clip_frac"], 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics["pg/ratio_max"], 4.0, rtol=1e-6)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_float64_reference(level, dual_clip, seed):
    logp, old, adv, mask = _random_inputs(seed)
    loss, metrics = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip,
                                ratio_level=level)
    ref_loss, ref_metrics = _np_policy_loss(logp, old, adv, mask, 0.2, 0.28, dual_clip, level)
    assert np.isfinite(loss)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for k, v in ref_metrics.items():
        np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_per_token_advantages_and_per_sample_bounds_match_reference():
    logp, old, adv, mask = _random_inputs(2)
    rng = np.random.default_rng(9)
    adv_bt = jnp.asarray(rng.normal(size=logp.shape), jnp.float32)
    lo_b = jnp.asarray(rng.uniform(0.05, 0.3, size=logp.shape[0]), jnp.float32)
    hi_bt = jnp.asarray(rng.uniform(0.05, 0.5, size=logp.shape), jnp.float32)
    loss, _ = policy_loss(logp, old, adv_bt, mask, clip_low=lo_b, clip_high=hi_bt)
    ref, _ = _np_policy_loss(logp, old, adv_bt, mask, lo_b, hi_bt, None, "token")
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)


def test_array_bounds_equal_scalar_bounds_exactly():
    logp, old, adv, mask = _random_inputs(3)
    b, t = logp.shape
    ref = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)[0]
    for shape in [(b,), (b, t)]:
        lo, hi = jnp.full(shape, 0.2), jnp.full(shape, 0.28)
        assert policy_loss(logp, old, adv, mask, clip_low=lo, clip_high=hi)[0] == ref


def test_extra_padding_leaves_loss_and_grad_unchanged():
    logp, old, adv, mask = _random_inputs(4)
    fn = lambda lp, o, m: policy_loss(lp, o, adv, m, clip_high=0.28, dual_clip=3.0)[0]
    pad = lambda x, v: jnp.pad(x, ((0, 0), (0, 3)), constant_values=v)
    value_and_grad = jax.jit(jax.value_and_grad(fn))
    loss, g = value_and_grad(logp, old, mask)
    loss2, g2 = value_and_grad(pad(logp, jnp.nan), pad(old, 3.0), pad(mask, False))
    np.testing.assert_allclose(loss2, loss, rtol=1e-6)
    np.testing.assert_allclose(g2[:, :5], g, rtol=1e-6)
    assert np.all(np.asarray(g2)[:, 5:] == 0.0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_accumulation_equals_full_batch(agg):
    logp, old, adv, mask = _random_inputs(5, b=8, huge=False)
    logp = jnp.where(mask, logp, 0.0)
    fn = lambda lp, o, a, m, z=None: policy_loss(lp, o, a, m, agg=agg, normalizer=z)[0]
    value_and_grad = jax.jit(jax.value_and_grad(fn))
    full, g_full = value_and_grad(logp, old, adv, mask)
    z = aggregation_normalizer(mask, agg)
    acc, g_acc = 0.0, []
    for i in range(0, 8, 4):
        v, g = value_and_grad(logp[i:i + 4], old[i:i + 4], adv[i:i + 4], mask[i:i + 4], z)
        acc, g_acc = acc + v, g_acc + [g]
    np.testing.assert_allclose(acc, full, rtol=1e-5)
    np.testing.assert_allclose(jnp.concatenate(g_acc), g_full, rtol=1e-5, atol=1e-7)


def test_gradients_finite_with_fully_masked_rows_and_check_grads():
    logp, old, adv, mask = _random_inputs(6, huge=False)
    logp = jnp.where(mask, logp, old)  # finite everywhere so check_grads can perturb
    # Wide clip bounds keep every ratio in the smooth (unclipped) region for the finite-difference check.
    fn = jax.jit(lambda lp: policy_loss(lp, old, adv, mask, clip_low=0.5, clip_high=0.5)[0])
    g = jax.jit(jax.grad(fn))(logp)
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[4] == 0.0)
    jax.test_util.check_grads(fn, (logp,), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)
    all_masked = jax.jit(jax.grad(lambda lp: policy_loss(lp, old, adv, jnp.zeros_like(mask))[0]))(logp)
    assert np.all(np.asarray(all_masked) == 0.0)


def test_old_logp_and_advantages_get_no_gradient():
    logp, old, adv, mask = _random_inputs(7, huge=False)
    logp = jnp.where(mask, logp, 0.0)
    g_old, g_adv = jax.jit(jax.grad(lambda o, a: policy_loss(logp, o, a, mask)[0], argnums=(0, 1)))(old, adv)
    assert np.all(np.asarray(g_old) == 0.0) and np.all(np.asarray(g_adv) == 0.0)


def test_entropy_bonus():
    ent = jnp.array([[1.0, 2.0, 5.0], [3.0, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0]])
    term, metrics = entropy_bonus(ent, mask, coef=0.01)
    np.testing.assert_allclose(term, -0.01 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["entropy/mean"], 2.0, rtol=1e-6)
    term2, _ = entropy_bonus(ent, mask, coef=0.01, agg="seq-mean-token-mean")
    np.testing.assert_allclose(term2, -0.01 * (1.5 + 3.0) / 2, rtol=1e-6)


def test_bad_inputs_raise_clear_errors():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="advantages must be a scalar, \\[B\\]"):
        policy_loss(x, x, jnp.zeros(3), x)
    with pytest.raises(ValueError, match="clip_low must be in"):
        policy_loss(x, x, jnp.zeros(2), x, clip_low=1.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(x, x, jnp.zeros(2), x, dual_clip=0.5)
    with pytest.raises(ValueError, match="ratio_level must be one of"):
        policy_loss(x, x, jnp.zeros(2), x, ratio_level="seq")
    with pytest.raises(AssertionError):
        policy_loss(x, jnp.zeros((2, 4)), jnp.zeros(2), x)
    with pytest.raises(ValueError, match="ClipConfig.clip_high"):
        ClipConfig(clip_high=-0.1)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        logp, old, adv, mask = _random_inputs(8)
        for level in ("token", "sequence"):
            fn = lambda a, b, c, d: policy_loss(a, b, c, d, clip_high=0.28, dual_clip=3.0, ratio_level=level)
            got, ref = self.variant(fn)(logp, old, adv, mask), fn(logp, old, adv, mask)
            chex.assert_trees_all_close(got, ref, rtol=1e-6)
