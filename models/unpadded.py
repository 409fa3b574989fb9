"""Unpadded forward: every per-token layer runs over a batch's real tokens only, attention over its padded rows.

A rollout batch holds B rows [prompt left-padded to W | completion right-padded to T] of width L = W + T;
with uniform lengths a quarter of those B·L positions is padding, and no row may be short enough to share a
packed row of width L with another (`jaxrl.rl.packing.rl_layout` then packs nothing). The unpadded layout
lays each block's rows' real tokens end to end in one row of N ≥ their count positions,

    [row 0's real tokens | row 1's | … | padding]        tokens_RN, R = blocks (one row per block),

and everything that acts per token — embedding, norms, q/k/v/o projections, MLP and the residual wiring of
every block variant — runs on that layout unchanged (`Transformer.forward(row_map=...)`). Only attention
knows the rows (`Unpadded`, dispatched in `layers.Attention`): q, k and v are gathered back to their padded
[B, L] places, `attention.attend` (or the platform's fused kernel) runs on the padded rows with their
causal key mask exactly as in the padded forward, and the output is gathered back to the unpadded positions:

    q_BL = q_RN[rows_BL],   out_RN = attend(q_BL, k_BL, v_BL)[src_RN]       (block by block)

so the dense layers compute N·R instead of B·L positions (0.78x at the uniform-length grid points of
benchmarks/RESULTS.md) while attention computes what it did. Both maps are injective on real tokens, so each
gather's gradient is the other gather (`permute`, a `custom_vjp`): no scatter-add, and the cotangents of the
padding slots (zero in exact arithmetic: no loss term reads a padding query, no real query sees a padding
key) are dropped. Positions are each token's position in its padded row (segments restart them,
`transformer._segmented`). Equal to the padded forward at every real position up to summation order
(tests/models/test_unpadded.py). verl's `use_remove_padding` runs the whole model unpadded with
FlashAttention's varlen kernels on GPU; here attention keeps the padded kernels every platform has.
"""

from __future__ import annotations

import chex
import flax.struct
import jax
import jax.numpy as jnp

from jaxrl.models.attention import KeyMask, attend


@jax.custom_vjp
def permute(x_RNF: jax.Array, index_RM: jax.Array, inverse_RN: jax.Array) -> jax.Array:
    """y[r, m] = x[r, index[r, m]] (0 where index < 0), batched over the leading (block) dimension.

    `inverse` must map back: inverse[r, index[r, m]] = m wherever index[r, m] >= 0, −1 at positions no m
    reads. The gradient is then the inverse gather, dx[r, n] = dy[r, inverse[r, n]] (0 where inverse < 0)."""
    return _gather(x_RNF, index_RM)


def _gather(x_RNF, index_RM):
    got = jnp.take_along_axis(x_RNF, jnp.maximum(index_RM, 0)[..., None], axis=1)
    return jnp.where((index_RM >= 0)[..., None], got, jnp.zeros((), x_RNF.dtype))


def _permute_fwd(x_RNF, index_RM, inverse_RN):
    return _gather(x_RNF, index_RM), (index_RM, inverse_RN)


def _permute_bwd(res, dy_RMF):
    index_RM, inverse_RN = res
    return _gather(dy_RMF, inverse_RN), None, None


permute.defvjp(_permute_fwd, _permute_bwd)


@flax.struct.dataclass
class Unpadded:
    """Where the unpadded positions sit in the padded rows (the `visible` argument of `Attention`).

    rows_BL: int32 [B, L], block-local unpadded position of padded slot (b, l) (block k = rows
      [k·B/R, (k+1)·B/R) of the padded batch, unpadded row k); −1 at padding.
    src_RN: int32 [R, N], block-local padded slot (i·L + l) of each unpadded position; −1 at padding.
    keys: the padded rows' causal `KeyMask` (real tokens: rows_BL >= 0; its kernel picks attention's).
    """

    rows_BL: jax.Array
    src_RN: jax.Array
    keys: KeyMask


def unpadded_visibility(rows_BL, src_RN, kernel: str = "xla") -> Unpadded:
    chex.assert_rank([rows_BL, src_RN], 2)
    return Unpadded(rows_BL, src_RN, KeyMask(rows_BL >= 0, kernel=kernel))


def attend_unpadded(q_RNKGH, k_RKNH, v_RKNH, visible: Unpadded) -> jax.Array:
    """Causal attention of the unpadded rows, computed on their padded rows (module docstring):
    [R, N, K, G, H] output.

    Args:
      q_RNKGH: [R, N, K, G, H] queries; k_RKNH, v_RKNH: [R, K, N, H] keys (after RoPE) and values.
      visible: the layout's `Unpadded`.
    """
    r, n, kv, g, h = q_RNKGH.shape
    b, length = visible.rows_BL.shape
    chex.assert_shape([k_RKNH, v_RKNH], (r, kv, n, h))
    chex.assert_shape(visible.src_RN, (r, n))
    if b % r:
        raise ValueError(f"{b} padded rows do not split into {r} blocks")
    rows_RM = visible.rows_BL.reshape(r, (b // r) * length)  # M = the block's B/R·L padded slots

    def to_rows(x_RNF, shape):
        return permute(x_RNF, rows_RM, visible.src_RN).reshape(shape)

    def kv_rows(x_RKNH):  # [R, K, N, H] -> [B, K, L, H]
        x_BLKH = to_rows(x_RKNH.transpose(0, 2, 1, 3).reshape(r, n, kv * h), (b, length, kv, h))
        return x_BLKH.transpose(0, 2, 1, 3)

    q_BLKGH = to_rows(q_RNKGH.reshape(r, n, kv * g * h), (b, length, kv, g, h))
    out_BLKGH = attend(q_BLKGH, kv_rows(k_RKNH), kv_rows(v_RKNH), visible.keys, causal=True)
    out_RNF = permute(out_BLKGH.reshape(r, (b // r) * length, kv * g * h), visible.src_RN, rows_RM)
    return out_RNF.reshape(r, n, kv, g, h)
