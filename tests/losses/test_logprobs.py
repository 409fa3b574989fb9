"""Tests for jaxrl.losses.logprobs: chunked logp/entropy equal the naive log_softmax (values and gradients)
and the compiled temporary memory does not scale with V."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import token_logprobs_and_entropy


def _np_reference(h, w, y, tau):
    z = np.einsum("btd,dv->btv", np.asarray(h, np.float64), np.asarray(w, np.float64)) / tau
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    p = np.exp(logp_all)
    return np.take_along_axis(logp_all, np.asarray(y)[..., None], -1)[..., 0], -(p * logp_all).sum(-1)


def _naive(h, w, y, tau=1.0):
    logp_all = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w) / tau)
    return (jnp.take_along_axis(logp_all, y[..., None], -1)[..., 0],
            -jnp.sum(jnp.exp(logp_all) * logp_all, -1))


def _inputs(seed, b=2, t=5, d=8, v=37, scale=1.0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(b, t, d)) * scale, jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
    y = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    return h, w, y


@pytest.mark.parametrize("chunk", [1, 5, 16, 36, 37, 1000])
@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_matches_naive_log_softmax(chunk, tau):
    h, w, y = _inputs(0)
    logp, ent = token_logprobs_and_entropy(h, w, y, chunk_size=chunk, temperature=tau)
    ref_logp, ref_ent = _np_reference(h, w, y, tau)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)
    assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32


def test_large_logits_and_peaked_distributions_stay_finite():
    h, w, y = _inputs(1, scale=30.0)  # logits of order 100s: near one-hot softmax
    logp, ent = token_logprobs_and_entropy(h, w, y, chunk_size=7)
    ref_logp, ref_ent = _np_reference(h, w, y, 1.0)
    assert np.all(np.isfinite(logp)) and np.all(np.isfinite(ent))
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(ent, ref_ent, atol=1e-4)


def test_bfloat16_hidden_is_upcast():
    h, w, y = _inputs(2)
    logp, _ = token_logprobs_and_entropy(h.astype(jnp.bfloat16), w.astype(jnp.bfloat16), y, chunk_size=8)
    ref, _ = _naive(h.astype(jnp.bfloat16).astype(jnp.float32), w.astype(jnp.bfloat16).astype(jnp.float32), y)
    assert logp.dtype == jnp.float32
    np.testing.assert_allclose(logp, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [4, 37])
def test_gradients_equal_naive_gradients(chunk):
    h, w, y = _inputs(3)
    rng = np.random.default_rng(4)
    c1, c2 = (jnp.asarray(rng.normal(size=y.shape), jnp.float32) for _ in range(2))
    obj = lambda fn: lambda a, b: jnp.sum(c1 * fn(a, b)[0] + c2 * fn(a, b)[1])
    chunked = lambda a, b: token_logprobs_and_entropy(a, b, y, chunk_size=chunk, temperature=0.8)
    got = jax.jit(jax.grad(obj(chunked), argnums=(0, 1)))(h, w)
    ref = jax.jit(jax.grad(obj(lambda a, b: _naive(a, b, y, 0.8)), argnums=(0, 1)))(h, w)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_check_grads_small():
    h, w, y = _inputs(5, b=1, t=2, d=3, v=7)
    fn = jax.jit(lambda a, b: token_logprobs_and_entropy(a, b, y, chunk_size=3))
    jax.test_util.check_grads(fn, (h, w), order=1, modes=["rev"], eps=1e-2, atol=2e-2, rtol=2e-2)


def _temp_bytes(fn, *args):
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_peak_memory_does_not_scale_with_vocab():
    b, t, d, c = 8, 128, 32, 512
    temps = []
    for v in (8192, 32768):
        h, w = jnp.zeros((b, t, d)), jnp.zeros((d, v))
        y = jnp.zeros((b, t), jnp.int32)
        loss = lambda a, bw: sum(x.sum() for x in token_logprobs_and_entropy(a, bw, y, chunk_size=c))
        fwd = _temp_bytes(lambda a, bw: token_logprobs_and_entropy(a, bw, y, chunk_size=c), h, w)
        bwd = _temp_bytes(jax.grad(loss, argnums=(0, 1)), h, w)
        naive = _temp_bytes(lambda a, bw: _naive(a, bw, y), h, w)
        full_logits = b * t * v * 4
        assert naive >= full_logits  # the naive path materialises [B, T, V] (sanity check of the measurement)
        assert fwd < 0.25 * full_logits and bwd < 0.25 * full_logits + d * v * 4
        temps.append((fwd, bwd - d * v * 4))
    # 4x the vocabulary: forward temporaries do not grow; the backward pass only by the [D, V] grad.
    assert temps[1][0] <= 1.1 * temps[0][0]
    assert temps[1][1] <= 1.1 * temps[0][1] + 2 * 32 * 32768 * 4


def test_bad_inputs():
    h, w, y = _inputs(6)
    with pytest.raises(ValueError, match="D=8 but w_DV has D=9"):
        token_logprobs_and_entropy(h, jnp.zeros((9, 37)), y)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        token_logprobs_and_entropy(h, w, y, chunk_size=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs_and_entropy(h, w, y, temperature=0.0)
    with pytest.raises(AssertionError):
        token_logprobs_and_entropy(h, w, y.astype(jnp.float32))


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        h, w, y = _inputs(7)
        fn = lambda a, b, c: token_logprobs_and_entropy(a, b, c, chunk_size=10)
        chex.assert_trees_all_close(self.variant(fn)(h, w, y), fn(h, w, y), rtol=1e-6, atol=1e-6)


def _np_vjp_reference(h, w, y, tau, g_logp, g_ent):
    """float64 numpy d(g_logp . logp + g_H . H)/d(h, W): dz = g_logp (1[v=y] - p) - g_H p (z - (lse - H))."""
    h64, w64 = np.asarray(h, np.float64), np.asarray(w, np.float64)
    z = np.einsum("btd,dv->btv", h64, w64) / tau
    zmax = z.max(-1, keepdims=True)
    lse = zmax + np.log(np.exp(z - zmax).sum(-1, keepdims=True))
    p = np.exp(z - lse)
    ent = lse - (p * z).sum(-1, keepdims=True)
    y_np = np.asarray(y)
    onehot = (np.arange(z.shape[-1]) == y_np[..., None]).astype(np.float64)
    g1, g2 = np.asarray(g_logp, np.float64)[..., None], np.asarray(g_ent, np.float64)[..., None]
    dz = (g1 * (onehot - p) - g2 * p * (z - (lse - ent))) / tau
    return np.einsum("btv,dv->btd", dz, w64), np.einsum("btd,btv->dv", h64, dz)


def _cotangents(seed, shape):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(2))


@pytest.mark.parametrize("chunk", [1, 4, 10, 37, 1000])
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_vjp_matches_numpy_reference_and_naive_autodiff(chunk, tau):
    h, w, y = _inputs(8)
    g = _cotangents(9, y.shape)
    out, vjp = jax.vjp(lambda a, b: token_logprobs_and_entropy(a, b, y, chunk_size=chunk, temperature=tau), h, w)
    dh, dw = vjp(g)
    assert dh.dtype == jnp.float32 and dw.dtype == jnp.float32
    ref_dh, ref_dw = _np_vjp_reference(h, w, y, tau, *g)
    np.testing.assert_allclose(dh, ref_dh, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-5, atol=1e-5)
    _, naive_vjp = jax.vjp(lambda a, b: _naive(a, b, y, tau), h, w)
    for got, ref in zip((dh, dw), naive_vjp(g)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_vjp_out_of_range_targets_are_finite_and_never_hit():
    h, w, _ = _inputs(10)
    y = jnp.asarray([[-1, 0, 36, 37, 5], [100, -7, 3, 2, 1]], jnp.int32)
    g = _cotangents(11, y.shape)
    _, vjp = jax.vjp(lambda a, b: token_logprobs_and_entropy(a, b, y, chunk_size=10), h, w)
    dh, dw = vjp(g)
    assert np.all(np.isfinite(dh)) and np.all(np.isfinite(dw))
    ref_dh, ref_dw = _np_vjp_reference(h, w, y, 1.0, *g)  # an out-of-range y matches no column of the one-hot
    np.testing.assert_allclose(dh, ref_dh, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_get_bfloat16_cotangents():
    h, w, y = _inputs(12)
    h16, w16 = h.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    g = _cotangents(13, y.shape)
    _, vjp = jax.vjp(lambda a, b: token_logprobs_and_entropy(a, b, y, chunk_size=8), h16, w16)
    dh, dw = vjp(g)
    assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
    ref_dh, ref_dw = _np_vjp_reference(h16.astype(jnp.float32), w16.astype(jnp.float32), y, 1.0, *g)
    np.testing.assert_allclose(dh.astype(jnp.float32), ref_dh, rtol=1e-2, atol=1e-2)  # bfloat16 rounding
    np.testing.assert_allclose(dw.astype(jnp.float32), ref_dw, rtol=1e-2, atol=1e-2)


def test_jit_grad_of_one_output_and_check_grads():
    h, w, y = _inputs(14)
    loss = lambda a, b: jnp.sum(token_logprobs_and_entropy(a, b, y, chunk_size=6, temperature=0.7)[0])
    dh, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(h, w)
    ref_dh, ref_dw = _np_vjp_reference(h, w, y, 0.7, np.ones(y.shape), np.zeros(y.shape))
    np.testing.assert_allclose(dh, ref_dh, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-5, atol=1e-5)
    fn = jax.jit(lambda a, b: token_logprobs_and_entropy(a, b, y, chunk_size=6, temperature=0.7))
    jax.test_util.check_grads(fn, (h, w), order=1, modes=["rev"], eps=1e-2, atol=2e-2, rtol=2e-2)
