"""Unpadded forward: every per-token layer runs over a batch's real tokens only, attention over each sequence.

A rollout batch holds B rows [prompt left-padded to W | completion right-padded to T] of width L = W + T;
with uniform lengths a quarter of those B·L positions is padding, and no row may be short enough to share a
packed row of width L with another (`jaxrl.rl.packing.rl_layout` then packs nothing). The unpadded layout
lays each block's rows' real tokens end to end in one row of N ≥ their count positions,

    [row 0's real tokens | row 1's | … | padding]        tokens_RN, R = blocks (one row per block),

and everything that acts per token — embedding, norms, q/k/v/o projections, MLP and the residual wiring of
every block variant — runs on that layout unchanged (`Transformer.forward(row_map=...)`). Only attention
knows the rows (`Unpadded`, dispatched in `layers.Attention`): q, k and v are gathered into rows of their own
sequences, `attention.attend` (or the platform's fused kernel) runs on those rows with their causal key mask
as in the padded forward, and the output is gathered back to the unpadded positions:

    q_c = q_RN[rows_c],   out_RN = Σ_c attend(q_c, k_c, v_c)[slots_c]       (block by block)

The attention rows come in C classes (`jaxrl.rl.unpadding`): each block's sequences sorted by length, C equal
groups, each sequence left-aligned in a row as wide as its class's longest (from a ladder of widths), so
attention reads ~Σ_c L_c²/2 pairs per class row instead of L²/2 per padded row: at uniform lengths between
L/2 and L, four classes read ~0.7x the padded rows' pairs. On XLA:CPU a class loops over its rows where
its blocks' scores pass ROW_LOOP_BYTES (not the padded forward's SCORE_BLOCK_BYTES): at 16 rows of 64 + 512
tokens the update ran 4924 instead of 4711 tokens/s, its temporaries 525 instead of 685 MiB. The dense layers compute N·R instead of B·L
positions (0.81x at the uniform-length grid points of benchmarks/RESULTS.md). Each gather is injective on real
tokens, so its gradient is the inverse gather (`permute`, a `custom_vjp`): no scatter-add, and the
cotangents of padding slots (zero in exact arithmetic: no loss term reads a padding query, no real query sees
a padding key) are dropped. Positions are each token's position in its padded row (segments restart them,
`transformer._segmented`). Equal to the padded forward at every real position up to summation order
(tests/models/test_unpadded.py). verl's `use_remove_padding` runs the whole model unpadded with
FlashAttention's varlen kernels on GPU; here attention keeps the padded kernels every platform has.
"""

from __future__ import annotations

import chex
import flax.struct
import jax
import jax.numpy as jnp

from jaxrl.models.attention import ROW_LOOP_BYTES, KeyMask, attend


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
    """Where the unpadded positions sit in the attention's rows (the `visible` argument of `Attention`).

    Attention runs over C classes of padded rows (`jaxrl.rl.unpadding`: a block's rows sorted by length, each
    class of A_c = B_c·R rows as wide as its longest, real tokens left-aligned); per class c:

    rows[c]: int32 [A_c, L_c], block-local unpadded position of each slot (block k = rows [k·A_c/R,
      (k+1)·A_c/R), unpadded row k); −1 at padding.
    slots[c]: int32 [R, N], block-local slot (i·L_c + l) of each unpadded position of class c; −1 elsewhere.
    keys[c]: the class rows' causal `KeyMask` (real tokens: rows >= 0; its kernel picks attention's).
    """

    rows: tuple
    slots: tuple
    keys: tuple


def unpadded_visibility(rows: tuple, slots: tuple, kernel: str = "xla") -> Unpadded:
    chex.assert_equal(len(rows), len(slots))
    chex.assert_rank([*rows, *slots], 2)
    return Unpadded(tuple(rows), tuple(slots), tuple(KeyMask(r >= 0, kernel=kernel) for r in rows))


def attend_unpadded(q_RNKGH, k_RKNH, v_RKNH, visible: Unpadded) -> jax.Array:
    """Causal attention of the unpadded rows, computed on their classes of padded rows (module docstring):
    [R, N, K, G, H] output, the sum over classes of each class's output at its own positions.

    Args:
      q_RNKGH: [R, N, K, G, H] queries; k_RKNH, v_RKNH: [R, K, N, H] keys (after RoPE) and values.
      visible: the layout's `Unpadded`.
    """
    r, n, kv, g, h = q_RNKGH.shape
    chex.assert_shape([k_RKNH, v_RKNH], (r, kv, n, h))
    q_RNF = q_RNKGH.reshape(r, n, kv * g * h)
    k_RNF, v_RNF = (x.transpose(0, 2, 1, 3).reshape(r, n, kv * h) for x in (k_RKNH, v_RKNH))
    out_RNF = jnp.zeros_like(q_RNF)
    for rows_AL, slots_RN, keys in zip(visible.rows, visible.slots, visible.keys):
        a, length = rows_AL.shape
        chex.assert_shape(slots_RN, (r, n))
        if a % r:
            raise ValueError(f"{a} attention rows do not split into {r} blocks")
        rows_RM = rows_AL.reshape(r, (a // r) * length)  # M = the block's A/R·L_c slots
        to_rows = lambda x_RNF, *shape: permute(x_RNF, rows_RM, slots_RN).reshape(a, length, *shape)
        k_AKLH, v_AKLH = (to_rows(x, kv, h).transpose(0, 2, 1, 3) for x in (k_RNF, v_RNF))
        out_ALKGH = attend(to_rows(q_RNF, kv, g, h), k_AKLH, v_AKLH, keys, causal=True, loop_above=ROW_LOOP_BYTES)
        out_RNF = out_RNF + permute(out_ALKGH.reshape(r, (a // r) * length, kv * g * h), slots_RN, rows_RM)
    return out_RNF.reshape(r, n, kv, g, h)
