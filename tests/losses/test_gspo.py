"""Tests for jaxrl.losses.gspo: spec algorithms-2 §1 worked example, float64 reference, GSPO vs GSPO-token,
jit, gradients, and agreement with TRL 1.16 (`importance_sampling_level="sequence"`, `loss_type="grpo"`)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import aggregation_normalizer, gspo_loss, gspo_objective

EPS = (3e-4, 4e-4)


def _spec_case(dtype=np.float64):
    """Spec §1 example: response 0 (L=3, A=+1), response 1 (L=2, A=-1), T=3."""
    d = np.array([[0.0010, -0.0004, 0.0009], [0.0030, -0.0010, 0.0]])
    old = np.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, -7.0]])
    mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    adv = np.array([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    return (old + d).astype(dtype), old.astype(dtype), adv.astype(dtype), mask


def _np_gspo(logp, old, adv, mask, lo, hi, token_level):
    """float64 reference of seq-mean-token-mean GSPO: (loss, d loss / d logp)."""
    logp, old, adv = (np.asarray(x, np.float64) for x in (logp, old, adv))
    m = np.asarray(mask, np.float64)
    lens = m.sum(1)
    ls = (np.where(m > 0, logp - old, 0.0)).sum(1) / np.maximum(lens, 1)
    s = np.exp(np.minimum(ls, 10.0))[:, None]
    per_tok = np.maximum(-adv * s, -adv * np.clip(s, 1 - lo, 1 + hi)) * m
    n_seq = max((lens > 0).sum(), 1)
    loss = (per_tok.sum(1) / np.maximum(lens, 1)).sum() / n_seq
    unclipped = (-adv * s >= -adv * np.clip(s, 1 - lo, 1 + hi))  # the max picks the unclipped branch
    active = unclipped & ~(((adv > 0) & (s > 1 + hi)) | ((adv < 0) & (s < 1 - lo)))
    w = m / np.maximum(lens, 1)[:, None] / n_seq  # d loss / d l_it
    if token_level:
        grad = w * np.where(active, -adv * s, 0.0)
    else:  # l_it depends on every logp of its row through s_i: d s_i / d logp_it' = s_i m_it' / L_i
        g_s = (w * np.where(active, -adv, 0.0)).sum(1, keepdims=True) * s
        grad = g_s * m / np.maximum(lens, 1)[:, None]
    return loss, grad


def _random_inputs(seed, b=6, t=5, scale=1e-3, per_token_adv=False):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, size=(b, t))
    logp = old + rng.normal(0.0, scale, size=(b, t))
    lens = rng.integers(1, t + 1, size=b)
    lens[1] = 0
    mask = np.arange(t)[None] < lens[:, None]
    adv = rng.normal(size=(b, t)) if per_token_adv else np.repeat(rng.normal(size=(b, 1)), t, 1)
    return logp, old, adv, mask


def test_spec_worked_example_value_and_gradient():
    with jax.enable_x64(True):
        logp, old, adv, mask = (jnp.asarray(x) for x in _spec_case())
        fn = lambda lp: gspo_loss(lp, old, adv, mask, clip_low=EPS[0], clip_high=EPS[1])[0]
        loss, grad = jax.jit(jax.value_and_grad(fn))(logp)
        np.testing.assert_allclose(loss, (-1.0004 + np.exp(0.001)) / 2, rtol=1e-12)
        np.testing.assert_allclose(loss, 0.00030025, atol=1e-9)
        assert np.all(np.asarray(grad)[0] == 0.0)  # response 0 clipped (s = 1.0005 > 1.0004, A > 0)
        np.testing.assert_allclose(grad[1, :2], [np.exp(0.001) / 4] * 2, rtol=1e-12)  # 0.25025 each
        assert grad[1, 2] == 0.0
        g_tok = jax.jit(jax.grad(lambda lp: gspo_loss(lp, old, adv, mask, clip_low=EPS[0], clip_high=EPS[1],
                                                      token_level=True)[0]))(logp)
        np.testing.assert_allclose(g_tok, grad, rtol=1e-12, atol=1e-15)


def test_spec_worked_example_metrics():
    logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _spec_case())
    _, metrics = gspo_objective(logp, old, adv, mask, clip_low=EPS[0], clip_high=EPS[1])
    np.testing.assert_allclose(metrics["pg/clip_frac_high"], 3 / 5, rtol=1e-6)
    np.testing.assert_allclose(metrics["pg/clip_frac_low"], 0.0)
    np.testing.assert_allclose(metrics["pg/seq_clip_frac"], 1 / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics["pg/ratio_max"], np.exp(0.001), rtol=1e-6)


def test_per_token_loss_is_the_sequence_term_on_every_valid_token():
    logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _spec_case())
    loss_BT, _ = gspo_objective(logp, old, adv, mask, clip_low=EPS[0], clip_high=EPS[1])
    np.testing.assert_allclose(loss_BT, [[-1.0004] * 3, [np.exp(0.001), np.exp(0.001), 0.0]], rtol=1e-6)


@pytest.mark.parametrize("token_level", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_float64_reference(token_level, seed):
    logp, old, adv, mask = _random_inputs(seed)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    fn = lambda lp: gspo_loss(lp, f32(old), f32(adv), jnp.asarray(mask), token_level=token_level)[0]
    loss, grad = jax.jit(jax.value_and_grad(fn))(f32(logp))
    ref_loss, ref_grad = _np_gspo(logp, old, adv, mask, *EPS, token_level)
    # float32 log-ratios of ~1e-3 computed from log-probs of ~-2 carry ~1e-7 absolute error.
    np.testing.assert_allclose(loss, ref_loss, atol=2e-6)
    np.testing.assert_allclose(grad, ref_grad, atol=2e-6)


def test_gspo_token_with_per_token_advantages_matches_reference_and_differs_from_gspo():
    logp, old, adv, mask = _random_inputs(3, scale=1e-5, per_token_adv=True)  # tiny ratios: nothing clipped
    with jax.enable_x64(True):
        a = [jnp.asarray(x) for x in (logp, old, adv, mask)]
        g_tok = jax.jit(jax.grad(lambda lp: gspo_loss(lp, *a[1:], token_level=True)[0]))(a[0])
        g_seq = jax.jit(jax.grad(lambda lp: gspo_loss(lp, *a[1:])[0]))(a[0])
    np.testing.assert_allclose(g_tok, _np_gspo(logp, old, adv, mask, *EPS, True)[1], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(g_seq, _np_gspo(logp, old, adv, mask, *EPS, False)[1], rtol=1e-10, atol=1e-14)
    assert np.max(np.abs(np.asarray(g_tok) - np.asarray(g_seq))) > 1e-2


def test_padding_garbage_and_extra_padding_do_not_leak():
    logp, old, adv, mask = _random_inputs(4)
    logp = np.where(mask, logp, np.nan)
    for token_level in (False, True):
        fn = lambda lp, o, a, m: gspo_loss(lp, o, a, m, token_level=token_level)[0]
        value_and_grad = jax.jit(jax.value_and_grad(fn))
        args = [jnp.asarray(x, jnp.float32) for x in (logp, old, adv)] + [jnp.asarray(mask)]
        loss, g = value_and_grad(*args)
        pad = lambda x, v: jnp.pad(x, ((0, 0), (0, 2)), constant_values=v)
        loss2, g2 = value_and_grad(pad(args[0], jnp.inf), pad(args[1], 1.0), pad(args[2], 5.0),
                                   pad(args[3], False))
        assert np.isfinite(loss) and np.all(np.isfinite(g))
        np.testing.assert_allclose(loss2, loss, rtol=1e-6)
        np.testing.assert_allclose(g2[:, :5], g, rtol=1e-6)
        assert np.all(np.asarray(g2)[:, 5:] == 0.0) and np.all(np.asarray(g)[1] == 0.0)


def test_check_grads_and_fully_masked_batch():
    logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_inputs(5, scale=0.1))
    for token_level in (False, True):
        # Wide clip bounds keep every ratio in the smooth region for the finite-difference check.
        fn = jax.jit(lambda lp: gspo_loss(lp, old, adv, mask, clip_low=0.9, clip_high=10.0,
                                          token_level=token_level)[0])
        jax.test_util.check_grads(fn, (logp,), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)
        empty = jnp.zeros_like(mask)
        g0 = jax.jit(jax.grad(lambda lp: gspo_loss(lp, old, adv, empty, token_level=token_level)[0]))(logp)
        assert np.all(np.asarray(g0) == 0.0)


def test_log_ratio_clamped_at_max_log_ratio():
    logp = jnp.array([[30.0, 30.0]])
    loss, m = gspo_loss(logp, jnp.zeros((1, 2)), -jnp.ones((1, 2)), jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, np.exp(10.0), rtol=1e-6)  # A < 0: unclipped branch, s capped at e^10
    np.testing.assert_allclose(m["pg/ratio_max"], np.exp(10.0), rtol=1e-6)


def test_micro_batch_accumulation_equals_full_batch():
    logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_inputs(6, b=8))
    fn = jax.jit(lambda lp, o, a, m, z=None: gspo_loss(lp, o, a, m, normalizer=z)[0])
    full = fn(logp, old, adv, mask)
    z = aggregation_normalizer(mask, "seq-mean-token-mean")
    acc = sum(fn(logp[i:i + 4], old[i:i + 4], adv[i:i + 4], mask[i:i + 4], z) for i in (0, 4))
    np.testing.assert_allclose(acc, full, rtol=1e-5)


def test_bad_inputs_raise_clear_errors():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="clip_low must be in"):
        gspo_objective(x, x, x, x, clip_low=1.0)
    with pytest.raises(ValueError, match="clip_high must be >= 0"):
        gspo_objective(x, x, x, x, clip_high=-1.0)
    with pytest.raises(AssertionError):
        gspo_objective(x, x, jnp.zeros(2), x)  # advantages must be [B, T]


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_agrees_with_trl_sequence_level_grpo(per_token_adv, seed):
    """TRL `importance_sampling_level="sequence"` with `loss_type="grpo"` is GSPO (spec §1, paper setup)."""
    oracle = pytest.importorskip("_trl_oracle")
    logp, old, adv, mask = _random_inputs(seed, per_token_adv=per_token_adv)
    keep = mask.any(1)  # TRL's "grpo" averages over all B rows, jaxrl over non-empty ones: drop empty rows
    logp, old, adv, mask = logp[keep], old[keep], adv[keep], mask[keep]
    trl_adv = adv if per_token_adv else adv[:, 0]
    trl_loss, trl_grad, trl_metrics = oracle.trl_compute_loss(logp, old, trl_adv, mask, loss_type="grpo",
                                                              level="sequence", epsilon_low=EPS[0],
                                                              epsilon_high=EPS[1])
    with jax.enable_x64(True):
        a = [jnp.asarray(x) for x in (logp, old, adv, mask)]
        value_and_grad = jax.jit(jax.value_and_grad(lambda lp: gspo_loss(lp, *a[1:]), has_aux=True))
        (loss, metrics), grad = value_and_grad(a[0])
    np.testing.assert_allclose(loss, trl_loss, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(grad, trl_grad, rtol=1e-10, atol=1e-15)
    if not per_token_adv:  # TRL's clip metrics are per sequence at sequence level
        assert 0.0 < trl_metrics["clip_ratio/region_mean"][0] < 1.0  # the case exercises both branches
        np.testing.assert_allclose(metrics["pg/seq_clip_frac"], trl_metrics["clip_ratio/region_mean"][0],
                                   rtol=1e-12)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_inputs(7))
        for token_level in (False, True):
            fn = lambda a, b, c, d: gspo_loss(a, b, c, d, token_level=token_level)
            args = (logp, old, adv, mask)
            chex.assert_trees_all_close(self.variant(fn)(*args), fn(*args), rtol=1e-6)
