"""`jaxrl.models.attention.attend` (recomputing backward) equals the dense softmax attention it replaced.

The reference `_dense` is the training branch of `Attention.__call__` before the change: float32 masked
scores, `jax.nn.softmax`, probabilities cast to the compute dtype, mixed with V, differentiated by JAX.
Tolerances (float32): values rtol 1e-6, gradients atol 1e-6 / rtol 1e-5, the ones test_dtypes_remat.py uses
for remat; the two differ only in summation order (blocks, rowsum(P ∘ dP) formed by hand).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig, attention, layers
from jaxrl.models.attention import KeyMask, attend, masked_scores
from tests.models._dense_attention import dense_visibility

B, L, K, G, H = 4, 13, 2, 3, 8


def _dense(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal=False):  # reads all keys whatever `causal`
    visible_BLS = dense_visibility(visible_BLS, q_BLKGH.shape[1])
    probs_BKGLS = jax.nn.softmax(masked_scores(q_BLKGH, k_BKSH, visible_BLS), axis=-1).astype(v_BKSH.dtype)
    return jnp.einsum("BKGLS,BKSH->BLKGH", probs_BKGLS, v_BKSH)


def _mask_BL() -> np.ndarray:
    """Row 0 full, row 1 left-padded by 4, row 2 right-padded by 5, row 3 all padding."""
    mask = np.ones((B, L), bool)
    mask[1, :4] = False
    mask[2, -5:] = False
    mask[3] = False
    return mask


def _inputs(seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, L, K, G, H)), dtype)
    k, v = (jnp.asarray(rng.normal(size=(B, K, L, H)), dtype) for _ in range(2))
    visible = jnp.asarray(_mask_BL()[:, None, :] & np.tri(L, dtype=bool)[None])
    weights = jnp.asarray(rng.normal(size=(B, L, K, G, H)), jnp.float32)
    return q, k, v, visible, weights


def _out_value_and_grads(fn, q, k, v, visible, weights):
    """(`fn`'s output, the weighted sum and its q/k/v gradients): one program, in which the plain forward and
    the forward under differentiation are the same operations."""
    def scalar(q, k, v):
        return jnp.sum(weights * fn(q, k, v, visible).astype(jnp.float32))

    val, grads = jax.value_and_grad(scalar, argnums=(0, 1, 2))(q, k, v)
    return fn(q, k, v, visible), val, grads


# Compiled once per attention function (static) and shape: op-by-op (eager) execution compiles every block's
# primitives separately, which cost most of this file's time.
_jit_out_value_and_grads = jax.jit(_out_value_and_grads, static_argnums=0)


@functools.cache
def _attend_fn(block_q: int, causal: bool):
    """`attend` with these settings, one object per pair, so that tests with the same settings and shapes
    share a compiled program (the program reads `attention.MAX_GROUPS` when traced: tests that patch it
    build their own)."""
    return functools.partial(attend, block_q=block_q, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_q", [1, 4, 13, 256])
def test_output_and_gradients_equal_the_dense_path(block_q, causal):
    _assert_equals_dense(_attend_fn(block_q, causal), *_inputs())


def _assert_equals_dense(fn, q, k, v, visible, weights):
    """`fn`'s output, value and q/k/v gradients equal the dense path's (float32, summation order only)."""
    out, val, grads = _jit_out_value_and_grads(fn, q, k, v, visible, weights)
    ref_out, ref_val, ref_grads = _jit_out_value_and_grads(_dense, q, k, v, visible, weights)
    np.testing.assert_allclose(out, ref_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(val, ref_val, rtol=1e-6)
    for name, got, want in zip("qkv", grads, ref_grads):
        assert np.max(np.abs(want)) > 1e-2, name  # the comparison is not between zeros
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("causal", [False, True])
def test_padding_queries_match_dense_and_stay_finite(causal):
    """Row 3 sees no key at all (and row 1's first 4 queries neither): uniform weights over all S keys, as
    the dense softmax of MASK_VALUE scores gives (also where a causal block reads fewer keys), zero dQ, and no
    NaN anywhere."""
    q, k, v, visible, weights = _inputs(seed=1)
    out, _, (dq, dk, dv) = _jit_out_value_and_grads(_attend_fn(4, causal), q, k, v, visible, weights)
    mean_v = jnp.broadcast_to(jnp.mean(v, axis=2)[:, None, :, None], out.shape)
    np.testing.assert_allclose(out[3], mean_v[3], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[1, :4], mean_v[1, :4], rtol=1e-6, atol=1e-6)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in (dq, dk, dv))
    np.testing.assert_array_equal(dq[3], 0.0)
    np.testing.assert_array_equal(dq[1, :4], 0.0)
    assert float(jnp.max(jnp.abs(dv[3]))) > 0  # padding queries still mix V, as in the dense VJP


def test_bfloat16_follows_the_dense_casts():
    """In bfloat16 both paths round the probabilities to bf16 before they mix V; the remaining difference is
    bf16 rounding of differently-ordered sums, so the bound is bf16's (2^-8 relative), for this test only."""
    q, k, v, visible, weights = _inputs(seed=2, dtype=jnp.bfloat16)
    out, _, grads = _jit_out_value_and_grads(_attend_fn(4, True), q, k, v, visible, weights)
    assert out.dtype == jnp.bfloat16
    ref, _, ref_grads = _jit_out_value_and_grads(_dense, q, k, v, visible, weights)
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=1e-2, atol=1e-2)
    for name, got, want in zip("qkv", grads, ref_grads):
        assert got.dtype == jnp.bfloat16, name
        scale = float(jnp.max(jnp.abs(want.astype(jnp.float32))))
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-2 * scale,
                                   err_msg=name)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_model_logprobs_and_gradients_equal_the_dense_path(scan_layers, monkeypatch):
    """Masked log-probs of a whole model (left- and right-padded rows) and their parameter gradients; blocks
    of 4 queries so that the causal key skipping is exercised."""
    cfg = TransformerConfig.tiny(norm="pre", family="qwen3", qk_norm=True, scan_layers=scan_layers)
    params = nnx.state(Transformer(cfg, rngs=nnx.Rngs(3)), nnx.Param).to_pure_dict()
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 64, (B, L)), jnp.int32)
    mask = jnp.asarray(_mask_BL()[[0, 1, 2, 0]])  # full, left-, right-padded; no all-padding row

    def loss(p):
        logits = Transformer.from_params(cfg, p).forward(tokens, mask_BL=mask).logits
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], -1)[..., 0]
        return jnp.sum(logp * mask[:, 1:]) / jnp.sum(mask[:, 1:])

    def value_and_grad_with(attend_fn, p):  # the model traced with `attend_fn` as its attention
        monkeypatch.setattr(layers, "attend", attend_fn)
        return jax.value_and_grad(loss)(p)

    # both models in one program: about 30% less compiling than two
    (val, grad), (ref_val, ref_grad) = jax.jit(
        lambda p: (value_and_grad_with(functools.partial(attend, block_q=4), p), value_and_grad_with(_dense, p))
    )(params)
    np.testing.assert_allclose(val, ref_val, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), grad, ref_grad)
    q_grad = grad["layers"]["self_attn"]["q_proj"]["kernel"]
    assert float(jnp.max(jnp.abs(q_grad))) > 1e-4  # attention gradients are part of the comparison


@pytest.mark.parametrize("max_groups", [1, 3])
@pytest.mark.parametrize("visibility,causal", [("dense", False), ("dense", True), ("key_mask_segments", True)])
def test_blocks_in_loops_equal_the_dense_path(max_groups, visibility, causal, monkeypatch):
    """More blocks than `MAX_GROUPS` (6 full blocks of 2 queries and a partial one): the blocks of a group run
    in a `lax.scan`, a causal group reading the keys of its last block; values and gradients are still the
    dense path's, for a dense visibility and for a `KeyMask` of packed rows."""
    monkeypatch.setattr(attention, "MAX_GROUPS", max_groups)
    q, k, v, visible, weights = _inputs(seed=3)
    if visibility == "key_mask_segments":
        segment_BL = jnp.asarray(np.repeat(np.arange(3), [5, 4, 4])[None].repeat(B, 0))
        visible = KeyMask(jnp.asarray(_mask_BL()), segment_BL, segment_BL)
    _assert_equals_dense(functools.partial(attend, block_q=2, causal=causal), q, k, v, visible, weights)


def test_the_program_stops_growing_with_length():
    """Forward + backward of 4 blocks has one block body per block; 32 and 128 blocks have `MAX_GROUPS` loop
    bodies each, so the same number of dots: the compile time no longer grows with L (64 unrolled blocks took
    70 s to compile on a 2-core CPU at L = 8192)."""
    def dots(length):
        q = jax.ShapeDtypeStruct((1, length, 1, 1, 8), jnp.float32)
        k = jax.ShapeDtypeStruct((1, 1, length, 8), jnp.float32)
        mask = jax.ShapeDtypeStruct((1, length), jnp.bool_)
        loss = lambda q, k, v, m: jnp.sum(attend(q, k, v, KeyMask(m), causal=True, block_q=2))  # noqa: E731
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, k, mask).as_text()
        return text.count("dot_general")

    assert dots(8) < dots(64) == dots(256)


def test_block_rows_keep_a_blocks_scores_under_the_budget():
    """128 queries per block while [B, heads, 128, S] float32 scores fit 24 MB (test-sized batches: fewer loops
    to compile), fewer for big ones (the update's 16 x 1088 with 8 heads: 32, 17.8 MB), never under 32."""
    assert attention.block_rows(8, 4, 320) == 128
    assert attention.block_rows(16, 8, 1088) == 32
    assert attention.block_rows(16, 8, 600) == 64
    assert attention.block_rows(64, 32, 8192) == 32
    for b, h, s in [(8, 4, 320), (16, 8, 1088), (16, 8, 600)]:
        rows = attention.block_rows(b, h, s)
        assert b * h * rows * s * 4 <= attention.SCORE_BLOCK_BYTES < b * h * 2 * rows * s * 4 or rows == 128


def test_batch_rows_loop_over_the_batch_only_where_its_blocks_would_not_fit():
    """On XLA:CPU with one device a batch whose 128-query blocks pass the score budget runs a few rows per
    loop (one at the update's shapes: 5.9 MB and 4.5 MB of scores per 128-query block); test-sized batches,
    several devices (a split batch) and every other backend keep one loop over all rows."""
    assert attention.batch_rows(16, 9, 1280, "cpu", 1) == 1
    assert attention.batch_rows(16, 8, 1088, "cpu", 1) == 1
    assert attention.batch_rows(256, 8, 128, "cpu", 1) == 8  # short rows: 8 of them per loop (4.2 MB)
    assert attention.batch_rows(8, 4, 320, "cpu", 1) == 8
    assert attention.batch_rows(16, 8, 1088, "cpu", 4) == 16
    assert attention.batch_rows(16, 8, 1088, "gpu", 1) == 16
    assert attention.batch_rows(16, 8, 1088, "tpu", 1) == 16


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("visibility,causal", [("dense", False), ("dense", True), ("key_mask_segments", True)])
def test_row_loops_equal_the_dense_path(rows, visibility, causal, monkeypatch):
    """The batch in loops of `rows` rows (budgets shrunk so that B = 4, L = 13 needs them): values and
    gradients are the dense path's, rows in their places (padding rows included), for a dense visibility and
    for a `KeyMask` of packed rows."""
    per_row = K * G * attention.QUERY_BLOCKS[0] * L * 4  # float32 scores of one row's 128-query block
    monkeypatch.setattr(attention, "SCORE_BLOCK_BYTES", B * per_row - 1)
    monkeypatch.setattr(attention, "ROW_LOOP_BYTES", rows * per_row)
    monkeypatch.setattr(attention.jax, "default_backend", lambda: "cpu")
    monkeypatch.setattr(attention.jax, "device_count", lambda: 1)
    assert attention.batch_rows(B, K * G, L) == rows
    q, k, v, visible, weights = _inputs(seed=4)
    if visibility == "key_mask_segments":
        segment_BL = jnp.asarray(np.repeat(np.arange(3), [5, 4, 4])[None].repeat(B, 0))
        visible = KeyMask(jnp.asarray(_mask_BL()), segment_BL, segment_BL)
    fn = functools.partial(attend, causal=causal)
    text = jax.jit(fn).lower(q, k, v, visible).as_text()
    assert text.count("while") >= 1  # the row loop is in the program
    _assert_equals_dense(fn, q, k, v, visible, weights)
