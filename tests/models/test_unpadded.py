"""`Transformer.forward(row_map=...)`, the unpadded forward (`jaxrl.models.unpadded`), equals the padded one.

Rows [prompt left-padded to W | completion right-padded to T] of random lengths (one row empty of completion,
one full) are laid end to end, two blocks of rows, each in one row of N positions with padding at its end;
the hidden state of every real token, and the gradient of a loss over them, must equal the padded forward's
at fp32 tolerances (values rtol 1e-5 / atol 1e-6; gradients atol 1e-6 of the leaf's largest entry, as in
test_shared_prompt.py). The maps are built here by a plain loop, independently of
`jaxrl.rl.unpadding.unpadded_layout` (tests/train/test_packed_update.py checks that one).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig
from jaxrl.models.unpadded import permute

B, W, T, R = 6, 5, 7, 2
L = W + T
CONFIGS = {
    "pre": TransformerConfig.tiny(),
    "qwen3_gqa_remat_mlp_unrolled": TransformerConfig.tiny(family="qwen3", qk_norm=True, num_heads=6,
                                                           num_kv_heads=3, remat="mlp", scan_layers=False),
}


def padded_rows(seed=0, vocab=64):
    """(tokens_BL, mask_BL): prompt lengths 1..W, completion lengths 1..T, row 1 without completion, the last
    row full."""
    rng = np.random.default_rng(seed)
    tokens, mask = np.zeros((B, L), np.int32), np.zeros((B, L), bool)
    for b in range(B):
        p, c = int(rng.integers(1, W + 1)), int(rng.integers(1, T + 1))
        p, c = (W, T) if b == B - 1 else (p, 0 if b == 1 else c)
        tokens[b, W - p:W + c] = rng.integers(3, vocab, size=p + c)
        mask[b, W - p:W + c] = True
    return tokens, mask


def unpad(tokens_BL, mask_BL, spare=3):
    """(tokens_RN, mask_RN, segment_RN, rows_BL, src_RN): each block of B/R rows end to end, `spare` padding
    positions after the fullest block."""
    per = B // R
    n = int(mask_BL.reshape(R, per * L).sum(1).max()) + spare
    tokens, mask, segment = np.zeros((R, n), np.int32), np.zeros((R, n), bool), np.zeros((R, n), np.int32)
    src, rows = np.full((R, n), -1, np.int32), np.full((B, L), -1, np.int32)
    for k in range(R):
        at = 0
        for i in range(per):
            b = k * per + i
            cols = np.flatnonzero(mask_BL[b])
            span = slice(at, at + len(cols))
            tokens[k, span], mask[k, span], segment[k, span] = tokens_BL[b, cols], True, i + 1
            src[k, span], rows[b, cols] = i * L + cols, np.arange(at, at + len(cols))
            at += len(cols)
    return tokens, mask, segment, rows, src


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hidden_and_gradients_equal_the_padded_forward(name):
    """Every parameter perturbed (norm weights 1 ± 0.1), a loss mixing the real hidden states nonlinearly."""
    cfg = CONFIGS[name]
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    graphdef, state = nnx.split(model)
    params = state.to_pure_dict()
    keys = iter(jax.random.split(jax.random.key(1), 256))
    params = jax.tree_util.tree_map_with_path(lambda path, a: 0.1 * jax.random.normal(next(keys), a.shape, a.dtype)
                                              + (1.0 if "norm" in jax.tree_util.keystr(path) else a), params)
    tokens, mask = padded_rows()
    unpadded = unpad(tokens, mask)

    def loss(p, tokens, mask, **kw):
        m = nnx.merge(graphdef, nnx.State(p))
        h = m.forward(tokens, None, mask, return_hidden=True, return_logits=False, **kw).hidden
        w = jnp.linspace(-1.0, 1.0, h.shape[-1])
        return jnp.sum(jnp.where(mask[..., None], jnp.tanh(h @ w)[..., None] * h, 0.0)), h

    @jax.jit
    def both(p):
        grad = jax.value_and_grad(loss, has_aux=True)
        t, m, seg, rows, src = unpadded
        return grad(p, tokens, mask), grad(p, t, m, segment_BL=seg, row_map=(rows, src))

    ((v, h), g), ((vu, hu), gu) = jax.device_get(both(params))
    rows, src = unpadded[3], unpadded[4]
    real = src >= 0
    k, n = np.nonzero(real)
    b, col = k * (B // R) + src[real] // L, src[real] % L
    assert len(k) == mask.sum() and np.array_equal(rows[b, col], n)
    np.testing.assert_allclose(hu[k, n], h[b, col], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(vu, v, rtol=1e-5)

    def close(path, got, want):
        scale = max(float(np.max(np.abs(want))), 1.0)
        np.testing.assert_allclose(got, want, atol=1e-6 * scale, rtol=1e-5, err_msg=jax.tree_util.keystr(path))

    jax.tree_util.tree_map_with_path(close, gu, g)
    assert float(np.max(np.abs(g["layers"]["self_attn"]["k_proj"]["kernel"]))) > 1e-3


def test_a_shifted_map_is_seen():
    """The comparison above is not blind: one padded slot's map moved by one position changes the hidden
    states of real tokens."""
    cfg = CONFIGS["pre"]
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    tokens, mask = padded_rows()
    t, m, seg, rows, src = unpad(tokens, mask)
    fwd = lambda rows, src: model.forward(t, None, m, return_hidden=True, return_logits=False, segment_BL=seg,
                                          row_map=(rows, src)).hidden
    good = np.asarray(fwd(rows, src))
    b, col = B - 1, W + 2  # the full row: swap two neighbouring tokens' places in its padded row
    bad_rows, bad_src = rows.copy(), src.copy()
    bad_rows[b, col], bad_rows[b, col + 1] = rows[b, col + 1], rows[b, col]
    k = b // (B // R)
    bad_src[k, rows[b, col]], bad_src[k, rows[b, col + 1]] = src[k, rows[b, col + 1]], src[k, rows[b, col]]
    assert np.abs(np.asarray(fwd(bad_rows, bad_src)) - good)[m].max() > 1e-3


def test_permute_gradient_is_the_inverse_gather():
    """For an injective map, `permute`'s custom gradient equals autodiff's scatter-add of the plain gather
    (and padding entries, index −1, read zeros and send nothing back)."""
    x = jax.random.normal(jax.random.key(0), (2, 5, 3))
    index = jnp.array([[4, -1, 0, 2], [1, 3, -1, -1]])
    inverse = jnp.array([[2, -1, 3, -1, 0], [-1, 0, -1, 1, -1]])
    dy = jax.random.normal(jax.random.key(1), (2, 4, 3))
    plain = lambda x: jnp.where((index >= 0)[..., None],
                                jnp.take_along_axis(x, jnp.maximum(index, 0)[..., None], axis=1), 0.0)
    y, vjp = jax.vjp(lambda x: permute(x, index, inverse), x)
    y_ref, vjp_ref = jax.vjp(plain, x)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_allclose(vjp(dy)[0], vjp_ref(dy)[0], rtol=0, atol=0)
    assert float(jnp.abs(y[0, 1]).max()) == 0.0
