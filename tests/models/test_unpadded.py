"""`Transformer.forward(row_map=...)`, the unpadded forward (`jaxrl.models.unpadded`), equals the padded one.

Rows [prompt left-padded to W | completion right-padded to T] of random lengths (one row empty of completion,
one full) are laid end to end, two blocks of rows, each in one row of N positions with padding at its end,
attention on two classes of rows by length (each sequence left-aligned in its class's width);
the hidden state of every real token, and the gradient of a loss over them, must equal the padded forward's
at fp32 tolerances (values rtol 1e-5 / atol 1e-6). Gradients: within the padded gradient's own rounding
sensitivity, measured: how far the padded gradient moves when every parameter is perturbed by 2 ulp (relative
2.4e-7, random signs), at least 1e-6 of the leaf's largest entry. A gradient entry is a sum over every position
with cancellation (the loss mixes hidden states nonlinearly), so two fp32 programs of different op structure
differ there by more than 1e-6 of the entry's scale on some CPUs (CI's, 2026-12-01: k_proj 1.65e-6) while
staying 2-7x inside that sensitivity; a wrong map moves the gradient by O(1) of its scale. The maps are built here by a plain loop, independently of
`jaxrl.rl.unpadding.unpadded_layout` (tests/train/test_packed_update.py checks that one).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig
from jaxrl.models.unpadded import permute

B, W, T, R = 8, 5, 7, 2
ULPS = 2 * float(np.finfo(np.float32).eps)  # the parameters' nudge, relative
L = W + T
CONFIGS = {
    "pre": TransformerConfig.tiny(),
    "pre_remat_attention": TransformerConfig.tiny(remat="attention"),  # keeps the class rows' core outputs
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


def unpad(tokens_BL, mask_BL, spare=3, classes=2):
    """(tokens_RN, mask_RN, segment_RN, rows, slots): each block of B/R rows end to end, `spare` padding
    positions after the fullest block; attention rows in `classes` classes of a block's rows by decreasing
    length, each sequence left-aligned in a row as wide as its class's longest (+1: one padding slot)."""
    per = B // R
    size = per // classes
    n = int(mask_BL.reshape(R, per * L).sum(1).max()) + spare
    tokens, mask, segment = np.zeros((R, n), np.int32), np.zeros((R, n), bool), np.zeros((R, n), np.int32)
    count = mask_BL.sum(1)
    order = [sorted(range(per), key=lambda i, k=k: -count[k * per + i]) for k in range(R)]
    widths = [max(count[k * per + i] for k in range(R) for i in order[k][c * size:(c + 1) * size]) + 1
              for c in range(classes)]
    rows = [np.full((R * size, x), -1, np.int32) for x in widths]
    slots = [np.full((R, n), -1, np.int32) for _ in widths]
    for k in range(R):
        at = 0
        for i in range(per):
            b = k * per + i
            cols = np.flatnonzero(mask_BL[b])
            here = np.arange(at, at + len(cols))
            tokens[k, here], mask[k, here], segment[k, here] = tokens_BL[b, cols], True, i + 1
            c, row = divmod(order[k].index(i), size)
            rows[c][k * size + row, :len(cols)] = here
            slots[c][k, here] = row * widths[c] + np.arange(len(cols))
            at += len(cols)
    return tokens, mask, segment, tuple(rows), tuple(slots)


def _positions_in_padded_rows(mask_BL, segment_RN):
    """(k, n, b, col): every real unpadded position (k, n) and its padded place (b, col)."""
    per = B // R
    k, n = np.nonzero(segment_RN)
    b = k * per + segment_RN[k, n] - 1
    col = np.concatenate([np.flatnonzero(mask_BL[bb]) for bb in range(B)])
    order = np.lexsort((n, k))  # positions run row by row, in order, within each block
    return k[order], n[order], b[order], col


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
        nudged = jax.tree_util.tree_map(
            lambda a: a * (1 + ULPS * jax.random.rademacher(jax.random.key(7), a.shape, a.dtype)), p)
        return (grad(p, tokens, mask), grad(p, t, m, segment_BL=seg, row_map=(rows, src)),
                grad(nudged, tokens, mask)[1])

    ((v, h), g), ((vu, hu), gu), g_nudged = jax.device_get(both(params))
    k, n, b, col = _positions_in_padded_rows(mask, unpadded[2])
    assert len(k) == mask.sum() and len({r.shape[1] for r in unpadded[3]}) == 2  # two class widths
    np.testing.assert_allclose(hu[k, n], h[b, col], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(vu, v, rtol=1e-5)

    def close(path, got, want, nudged):
        floor = max(float(np.max(np.abs(want))), 1.0) * 1e-6
        sensitivity = float(np.max(np.abs(nudged - want)))
        np.testing.assert_allclose(got, want, atol=max(floor, sensitivity), rtol=1e-5,
                                   err_msg=jax.tree_util.keystr(path))

    jax.tree_util.tree_map_with_path(close, gu, g, g_nudged)
    assert float(np.max(np.abs(g["layers"]["self_attn"]["k_proj"]["kernel"]))) > 1e-3


def test_a_shifted_map_is_seen():
    """The comparison above is not blind: two neighbouring tokens swapped in their attention row change the
    hidden states of real tokens."""
    model = Transformer(CONFIGS["pre"], rngs=nnx.Rngs(1))
    tokens, mask = padded_rows()
    t, m, seg, rows, slots = unpad(tokens, mask)
    fwd = lambda rows, slots: model.forward(t, None, m, return_hidden=True, return_logits=False, segment_BL=seg,
                                            row_map=(rows, slots)).hidden
    good = np.asarray(fwd(rows, slots))
    bad_rows, bad_slots = [r.copy() for r in rows], [x.copy() for x in slots]
    p, q = rows[0][0, 2], rows[0][0, 3]  # the longest row of block 0: its 3rd and 4th tokens
    bad_rows[0][0, 2], bad_rows[0][0, 3] = q, p
    bad_slots[0][0, p], bad_slots[0][0, q] = slots[0][0, q], slots[0][0, p]
    assert np.abs(np.asarray(fwd(tuple(bad_rows), tuple(bad_slots))) - good)[m].max() > 1e-3


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
