"""Tests for jaxrl.losses.gae: hand-computed GAE and value-loss cases, float64 transcriptions of verl's
`compute_gae_advantage_return` and `compute_value_loss`, reward placement, gradients, jit equality."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import AggMode, aggregation_normalizer, gae_advantages, outcome_token_rewards, value_loss


def _verl_whiten(values, mask):
    """verl `masked_whiten`: masked mean, unbiased masked variance, (x - mean) * rsqrt(var + 1e-8)."""
    n = mask.sum()
    mean = (values * mask).sum() / (n + 1e-8)
    var = (((values - mean) ** 2) * mask).sum() / (n + 1e-8) * n / (n - 1)
    return (values - mean) / np.sqrt(var + 1e-8)


def _verl_gae(token_rewards, values, mask, gamma, lam):
    """verl `compute_gae_advantage_return` in float64: reversed loop; on a mask-0 token the running next value
    and running advantage are kept (the token's TD error is dropped). Returns (raw advantages, returns,
    whitened advantages), all as verl leaves them, i.e. not multiplied by the mask."""
    r, v, m = (np.asarray(x, np.float64) for x in (token_rewards, values, mask))
    next_v, last = np.zeros(len(r)), np.zeros(len(r))
    adv = np.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_v - v[:, t]
        new = delta + gamma * lam * last
        next_v = v[:, t] * m[:, t] + (1 - m[:, t]) * next_v
        last = new * m[:, t] + (1 - m[:, t]) * last
        adv[:, t] = last
    return adv, adv + v, _verl_whiten(adv, m)


def _verl_value_loss(vpreds, returns, values, mask, clip):
    """verl `compute_value_loss` (token-mean) in float64: 0.5 * masked mean of max(unclipped, clipped) squared
    errors; clip fraction = masked mean of clipped > unclipped (strict)."""
    vpreds, returns, values, mask = (np.asarray(x, np.float64) for x in (vpreds, returns, values, mask))
    vclip = np.maximum(np.minimum(vpreds, values + clip), values - clip)
    l1, l2 = (vpreds - returns) ** 2, (vclip - returns) ** 2
    n = mask.sum() + 1e-8
    return 0.5 * (np.maximum(l1, l2) * mask).sum() / n, ((l2 > l1) * mask).sum() / n


def _random_case(seed, n=6, t=10):
    """Ragged lengths and holes (tool observations) inside rows; one row is fully masked."""
    rng = np.random.default_rng(seed)
    mask = np.arange(t)[None, :] < rng.integers(1, t + 1, size=n)[:, None]
    mask &= rng.random((n, t)) > 0.25
    mask[:, 0] = True
    mask[-1] = False
    return rng.normal(size=(n, t)), rng.normal(size=(n, t)), mask


def _f32(*xs):
    return tuple(jnp.asarray(x, jnp.float32) for x in xs)


def test_hand_computed_gae():
    v = jnp.array([[0.5, 0.25, 1.0]])
    r = jnp.array([[0.0, 0.0, 2.0]])  # outcome R = 2 at the last token
    m = jnp.ones((1, 3), bool)
    # γ = λ = 1: A_t = R - V_t = 1.5, 1.75, 1.0; returns = R = 2 everywhere
    adv, ret = gae_advantages(r, v, m, gamma=1.0, lam=1.0, whiten=False)
    np.testing.assert_allclose(adv, [[1.5, 1.75, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[2.0, 2.0, 2.0]], rtol=1e-6)
    # λ = 0, γ = 1: one-step TD  δ_0 = 0 + 0.25 - 0.5 = -0.25,  δ_1 = 0 + 1 - 0.25 = 0.75,  δ_2 = 2 + 0 - 1 = 1
    adv, ret = gae_advantages(r, v, m, gamma=1.0, lam=0.0, whiten=False)
    np.testing.assert_allclose(adv, [[-0.25, 0.75, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[0.25, 1.0, 2.0]], rtol=1e-6)
    # γ = λ = 0.5: δ_2 = 2 - 1 = 1                      A_2 = 1
    #              δ_1 = 0 + 0.5·1 - 0.25 = 0.25        A_1 = 0.25 + 0.25·1 = 0.5
    #              δ_0 = 0 + 0.5·0.25 - 0.5 = -0.375    A_0 = -0.375 + 0.25·0.5 = -0.25
    adv, ret = gae_advantages(r, v, m, gamma=0.5, lam=0.5, whiten=False)
    np.testing.assert_allclose(adv, [[-0.25, 0.5, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[0.25, 0.75, 2.0]], rtol=1e-6)
    # whitened: mean 5/12, unbiased var ((-2/3)² + (1/12)² + (7/12)²)/2 = (64 + 1 + 49)/288 = 114/288
    adv, _ = gae_advantages(r, v, m, gamma=0.5, lam=0.5)
    s = np.sqrt(114 / 288 + 1e-8)
    np.testing.assert_allclose(adv, [[(-2 / 3) / s, (1 / 12) / s, (7 / 12) / s]], rtol=1e-6)


def test_hand_computed_gae_hole():
    # tokens 0, 1 trained, 2 a tool observation (its reward 9 and value 7 are ignored), 3 trained with R = 1.
    r = jnp.array([[0.0, 0.0, 9.0, 1.0]])
    v = jnp.array([[0.5, 0.25, 7.0, 0.75]])
    m = jnp.array([[1, 1, 0, 1]], bool)
    # γ = λ = 0.5:  A_3 = 1 - 0.75 = 0.25;  hole: V_next = 0.75, A_next = 0.25 pass through
    #               δ_1 = 0 + 0.5·0.75 - 0.25 = 0.125,  A_1 = 0.125 + 0.25·0.25 = 0.1875
    #               δ_0 = 0 + 0.5·0.25 - 0.5 = -0.375,  A_0 = -0.375 + 0.25·0.1875 = -0.328125
    adv, ret = gae_advantages(r, v, m, gamma=0.5, lam=0.5, whiten=False)
    np.testing.assert_allclose(adv, [[-0.328125, 0.1875, 0.0, 0.25]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[0.171875, 0.4375, 0.0, 1.0]], rtol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.99, 0.95), (0.5, 0.0), (0.0, 0.7)])
@pytest.mark.parametrize("seed", [0, 1])
def test_gae_matches_verl_transcription(seed, gamma, lam):
    r, v, mask = _random_case(seed)
    m = mask.astype(np.float64)
    raw, ret, white = _verl_gae(r, v, mask, gamma, lam)
    adv_raw, ret_got = gae_advantages(*_f32(r, v), jnp.asarray(mask), gamma=gamma, lam=lam, whiten=False)
    adv_white, _ = gae_advantages(*_f32(r, v), jnp.asarray(mask), gamma=gamma, lam=lam)
    np.testing.assert_allclose(adv_raw, raw * m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret_got, ret * m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv_white, white * m, rtol=1e-5, atol=1e-5)


def test_outcome_rewards_then_gae_matches_verl():
    _, v, mask = _random_case(3)
    rewards = np.random.default_rng(3).normal(size=mask.shape[0])
    tok = np.asarray(outcome_token_rewards(jnp.asarray(rewards, jnp.float32), jnp.asarray(mask)))
    _, _, white = _verl_gae(tok, v, mask, 1.0, 0.95)
    got, _ = gae_advantages(jnp.asarray(tok), *_f32(v), jnp.asarray(mask), gamma=1.0, lam=0.95)
    np.testing.assert_allclose(got, white * mask, rtol=1e-5, atol=1e-5)


def test_outcome_token_rewards_last_trained_token():
    mask = jnp.array([[1, 1, 0, 1, 0], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    got = outcome_token_rewards(jnp.array([1.0, 2.0, 3.0, 4.0]), mask)
    expected = [[0, 0, 0, 1, 0], [0, 0, 2, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 4]]
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == jnp.float32


def test_masked_garbage_is_ignored():
    r, v, mask = _random_case(4)
    r_bad, v_bad = np.where(mask, r, np.nan), np.where(mask, v, np.inf)
    for whiten in (False, True):
        clean = gae_advantages(*_f32(r, v), jnp.asarray(mask), gamma=0.9, lam=0.8, whiten=whiten)
        dirty = gae_advantages(*_f32(r_bad, v_bad), jnp.asarray(mask), gamma=0.9, lam=0.8, whiten=whiten)
        for a, b in zip(clean, dirty):
            np.testing.assert_array_equal(a, b)


def test_hand_computed_value_loss():
    v = jnp.array([[1.0, 0.0, 0.5, 9.0]])
    old = jnp.array([[0.0, 0.0, 0.0, 0.0]])
    ret = jnp.array([[0.0, 1.0, 0.5, 0.0]])
    m = jnp.array([[1, 1, 1, 0]], bool)
    # c = 0.2: V_clip = 0.2, 0, 0.2.  unclipped (V-R)² = 1, 1, 0;  clipped (V_clip-R)² = 0.04, 1, 0.09
    # max = 1, 1, 0.09 -> 0.5 · 2.09 / 3;  clipped > unclipped only on token 2 (token 1 a tie) -> 1/3
    # V mean over the mask = 1.5 / 3 = 0.5
    loss, metrics = value_loss(v, old, ret, m, clip=0.2)
    np.testing.assert_allclose(loss, 0.5 * 2.09 / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["critic/vf_clip_frac"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["critic/vpred_mean"], 0.5, rtol=1e-6)
    # clip None: 0.5 · mean (V-R)² = 0.5 · 2 / 3
    loss, metrics = value_loss(v, old, ret, m, clip=None)
    np.testing.assert_allclose(loss, 1 / 3, rtol=1e-6)
    assert float(metrics["critic/vf_clip_frac"]) == 0.0


def test_value_loss_clip_none_is_half_mse():
    _, v, mask = _random_case(5)
    rng = np.random.default_rng(5)
    ret, old = rng.normal(size=v.shape), rng.normal(size=v.shape)
    loss, _ = value_loss(*_f32(v, old, ret), jnp.asarray(mask), clip=None)
    np.testing.assert_allclose(loss, 0.5 * ((v - ret) ** 2 * mask).sum() / mask.sum(), rtol=1e-5)


@pytest.mark.parametrize("clip", [0.0, 0.2, 0.5, 10.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_value_loss_matches_verl_transcription(seed, clip):
    _, v, mask = _random_case(seed)
    rng = np.random.default_rng(seed + 10)
    old, ret = v + 0.4 * rng.normal(size=v.shape), rng.normal(size=v.shape)
    loss, metrics = value_loss(*_f32(v, old, ret), jnp.asarray(mask), clip=clip)
    ref_loss, ref_frac = _verl_value_loss(v, ret, old, mask, clip)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["critic/vf_clip_frac"], ref_frac, rtol=1e-5)


@pytest.mark.parametrize("agg", list(AggMode))
def test_value_loss_micro_batches_sum_to_full_batch(agg):
    _, v, mask = _random_case(6, n=8)
    rng = np.random.default_rng(6)
    old, ret = v + 0.3 * rng.normal(size=v.shape), rng.normal(size=v.shape)
    args = (*_f32(v, old, ret), jnp.asarray(mask))
    full, _ = value_loss(*args, clip=0.2, agg=agg)
    z = aggregation_normalizer(jnp.asarray(mask), agg)
    parts = [value_loss(*(a[i:i + 4] for a in args), clip=0.2, agg=agg, normalizer=z)[0] for i in (0, 4)]
    np.testing.assert_allclose(sum(parts), full, rtol=1e-5)


def test_value_loss_gradient_zero_at_masked_positions():
    _, v, mask = _random_case(7)
    rng = np.random.default_rng(7)
    old, ret = v + 0.3 * rng.normal(size=v.shape), rng.normal(size=v.shape)
    old, ret = np.where(mask, old, np.nan), np.where(mask, ret, np.nan)  # garbage where masked
    grad_fn = jax.grad(lambda x: value_loss(x, *_f32(old, ret), jnp.asarray(mask), clip=0.2)[0])
    g = np.asarray(grad_fn(jnp.asarray(v, jnp.float32)))
    assert np.isfinite(g).all()
    np.testing.assert_array_equal(g[~mask], 0.0)
    assert np.abs(g[mask]).sum() > 0
    jax.test_util.check_grads(lambda x: value_loss(x, *_f32(old, ret), jnp.asarray(mask), clip=None)[0],
                              (jnp.asarray(v, jnp.float32),), order=1, modes=["rev"], eps=1e-2)


def test_bad_inputs():
    r, m = jnp.zeros((2, 3)), jnp.ones((2, 3), bool)
    for kw in ({"gamma": 1.5, "lam": 1.0}, {"gamma": -0.1, "lam": 1.0}):
        with pytest.raises(ValueError, match="gamma"):
            gae_advantages(r, r, m, **kw)
    with pytest.raises(ValueError, match="lam"):
        gae_advantages(r, r, m, gamma=1.0, lam=1.01)
    with pytest.raises(ValueError, match="clip"):
        value_loss(r, r, r, m, clip=-0.1)
    with pytest.raises(AssertionError):
        gae_advantages(r, jnp.zeros((2, 4)), m, gamma=1.0, lam=1.0)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        r, v, mask = _random_case(8)
        args = (*_f32(r, v), jnp.asarray(mask))
        gae = self.variant(lambda a, b, c: gae_advantages(a, b, c, gamma=0.99, lam=0.95))
        for got, ref in zip(gae(*args), gae_advantages(*args, gamma=0.99, lam=0.95)):
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
        vl_args = (args[1], args[1] + 0.1 * args[0], args[0], args[2])  # values, old values, returns, mask
        vl = self.variant(lambda a, b, c, d: value_loss(a, b, c, d, clip=0.2))
        (loss, met), (ref_loss, ref_met) = vl(*vl_args), value_loss(*vl_args, clip=0.2)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
        chex.assert_trees_all_close(met, ref_met, rtol=1e-6)
        tok = self.variant(outcome_token_rewards)
        np.testing.assert_array_equal(tok(args[0][:, 0], args[2]), outcome_token_rewards(args[0][:, 0], args[2]))
