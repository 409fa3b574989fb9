"""Attention core of the full-sequence (training / scoring) forward, with a recomputing backward pass.

    out = softmax(q kᵀ / √H + mask) v,   mask = 0 where a key is visible, MASK_VALUE elsewhere.

Differentiating the dense formula keeps the float32 scores and probabilities [B, K, G, L, S] of every layer
for the backward pass; at L = 1024 that is 256 MiB per tensor and layer at B = 8 (benchmarks/RESULTS.md).
`attend` is a `jax.custom_vjp` in the manner of FlashAttention (Dao et al. 2022, arXiv:2205.14135): the
forward keeps q, k, v, the visibility mask and, per query, the row maximum m and the normaliser
ℓ = Σ_s exp(s − m) (O(L) each, where FlashAttention keeps logsumexp = m + log ℓ); the backward recomputes

    P = exp(S − m) / ℓ,   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − rowsum(P ∘ dP)),
    dQ = dS K / √H,       dK = dSᵀ Q / √H          (dS zero where a key is not visible).

Both passes run over blocks of `block_q` queries, so that only one block's [B, K, G, block_q, S] scores exist at a
time (`block_rows`: 128 queries, fewer where a block's scores would pass 24 MB: at B·L = 16 × 1088 blocks of 32
keep them in this CPU's caches, and forward + backward ran 1.9x faster than with 128; on XLA:CPU with one device a
batch that big loops over its rows instead, a few at a time in 128-query blocks (`batch_rows`, 1.3x faster again);
the loops read the queries as [B, K, G, L, H], heads ahead of rows, so each product is a batched matrix product
without transposes, and dK, dV accumulate as [B, K, H, S]: their products transpose the small block of q or dO
instead of the block's scores); past MAX_GROUPS blocks, consecutive blocks run as one `lax.scan` (`_groups`), so
the program, and its compile time, stop growing with L (on a 2-core CPU, forward + backward at L = 8192: 70 s to
compile with 64 unrolled blocks, 14 s in 16 loops; 32768: 342 s and 11 s; the run time did not grow). With
`causal=True` (query l is the key at slot S − L + l and sees no later key, as in a causal LM's full-sequence
forward, S = L, or a completion attending over [shared prompt keys | its own keys], `jaxrl.models.shared_prompt`)
a block of queries ending at row r reads keys [0, S − L + r) only, which skips about half of the self-attention
scores; a query with no visible key still gets the dense result (its unread keys carry the same weight 1/S).

Numerics are the dense path's: the same float32 scores, masking and softmax (P = exp(S − m) / ℓ, the
operations of `jax.nn.softmax`), probabilities cast to the compute dtype before they mix V, and the backward
follows the casts of the dense VJP (rowsum(P ∘ dP) rather than FlashAttention's rowsum(dO ∘ O), which
differs in the compute dtype); only summation orders differ (tests/models/test_attention_core.py). A query
with no visible key (padding) gets uniform probabilities over all S keys, as with the dense softmax of
MASK_VALUE scores, and zero dQ; its dV contribution is kept, as in the dense VJP.
"""

from __future__ import annotations

import functools

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.ad_checkpoint import checkpoint_name

# what `model.remat: attention` keeps of each layer: the core's output and its per-query softmax statistics
ATTENTION_CORE_NAMES = ("attention_out", "attention_max", "attention_norm")
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# Queries per block (`block_rows`): the most of QUERY_BLOCKS whose float32 scores [B, K, G, rows, S] stay under
# SCORE_BLOCK_BYTES, at least the smallest. On the 2-core Intel Xeon of 2026-11-30, B x L = 16 x 1088 (8 query
# heads): forward + backward 0.66 s with 32-query blocks (17.8 MB of scores), 0.83 with 64, 1.32 with 128
# (71 MB); small batches keep 128 rows, fewer loops to compile (benchmarks/RESULTS.md).
QUERY_BLOCKS = (128, 64, 32)
SCORE_BLOCK_BYTES = 24 << 20
# Loops per pass at most (+1 for a partial block): the program's size, and its compile time, stop growing
# with L (64 unrolled blocks took 70 s to compile on this CPU at L = 8192, and longer on a GPU). 8 rather than 16:
# at 16 x 1088 in 32-query blocks, 4, 8 and 16 loops ran alike and compiled in 5.2, 7.5 and 12.5 s.
MAX_GROUPS = 8
# On XLA:CPU, where a batch's 128-query blocks would pass SCORE_BLOCK_BYTES, the core loops over the batch
# instead (`batch_rows`): a few rows per loop whose 128-query blocks stay under ROW_LOOP_BYTES, in this CPU's
# caches. On the 2-core Intel Xeon of 2026-11-30 (benchmarks/RESULTS.md), forward + backward of 16 x 1280
# (9 query heads over 3 of 64): 1.29 s in 32-query blocks of all rows, 0.99 s one row at a time in blocks of
# 128 (5.9 MB of scores), 1.33 s four rows at a time (23.6 MB); the tiny model's 16 x 1088: 0.61 -> 0.47 s.
ROW_LOOP_BYTES = 6 << 20


def block_rows(batch: int, heads: int, num_keys: int) -> int:
    """Queries per block of the blocked core: the largest of QUERY_BLOCKS whose [batch, heads, rows, num_keys]
    float32 scores fit SCORE_BLOCK_BYTES (else the smallest). Static: read from the global shapes, the same on
    every host and device count, so N processes compute what one does."""
    for rows in QUERY_BLOCKS:
        if batch * heads * rows * num_keys * 4 <= SCORE_BLOCK_BYTES:
            return rows
    return QUERY_BLOCKS[-1]


def batch_rows(batch: int, heads: int, num_keys: int, backend: str | None = None, devices: int | None = None,
               loop_above: int | None = None) -> int:
    """Rows of the batch per loop of the blocked core: all of them, except on XLA:CPU with one device
    (`backend`, `devices`: default JAX's default backend and device count) where their 128-query blocks'
    float32 scores [batch, heads, 128, num_keys] would pass `loop_above` (None: SCORE_BLOCK_BYTES; the unpadded
    forward's classes of a few rows pass ROW_LOOP_BYTES, `jaxrl.models.unpadded`): then the most rows, a
    divisor of `batch`, whose 128-query blocks stay under ROW_LOOP_BYTES (at least one). Static, from the global
    shapes. With several devices the batch is split over them and a loop over rows would gather it (GSPMD
    cannot give each device its own rows without knowing the split), so they keep one loop over all rows."""
    backend = jax.default_backend() if backend is None else backend
    devices = jax.device_count() if devices is None else devices
    full = QUERY_BLOCKS[0]
    loop_above = SCORE_BLOCK_BYTES if loop_above is None else loop_above
    if backend != "cpu" or devices != 1 or batch * heads * full * num_keys * 4 <= loop_above:
        return batch
    fits = [r for r in range(1, batch) if batch % r == 0 and r * heads * full * num_keys * 4 <= ROW_LOOP_BYTES]
    return max(fits, default=1)


@struct.dataclass
class KeyMask:
    """Which keys each query sees, in O(S) memory instead of a [B, L, S] tensor.

    Query l (at key slot S − L + l) sees key s iff the key is real, `key_mask_BS[b, s]`; with `causal` in
    `attend`, s ≤ S − L + l; with segments, `query_segment_BL[b, l] == key_segment_BS[b, s]`. This is the
    dense visibility `mask[:, None, :] & tril` of a padded (or packed) causal row, built one block of
    queries at a time, so that no [B, L, S] mask exists in the forward or is kept for the backward pass (at
    32k tokens the dense mask is 1 GiB per row).

    `kernel` picks the attention kernel (`Transformer.forward` sets it from `TransformerConfig.attention`):
    "xla", the blocked core below; "cudnn", `jax.nn.dot_product_attention`'s fused kernel (packed segments
    stay on "xla"); "splash", Pallas splash attention on TPU (`jaxrl.models.attention_fused`).
    """

    key_mask_BS: jax.Array
    query_segment_BL: Optional[jax.Array] = None
    key_segment_BS: Optional[jax.Array] = None
    kernel: str = struct.field(pytree_node=False, default="xla")

    def block(self, row0, size: int, keys: int, num_queries: int, causal: bool) -> jax.Array:
        """[B, size, keys] bool: visibility of queries [row0, row0 + size) (`row0` may be traced) over keys
        [0, keys)."""
        visible_BRS = jnp.broadcast_to(self.key_mask_BS[:, None, :keys], (self.key_mask_BS.shape[0], size, keys))
        if causal:
            slots_R = row0 + jnp.arange(size) + (self.key_mask_BS.shape[1] - num_queries)
            visible_BRS = visible_BRS & (jnp.arange(keys)[None, :] <= slots_R[:, None])[None]
        if self.query_segment_BL is not None:
            segment_BR = jax.lax.dynamic_slice_in_dim(self.query_segment_BL, row0, size, axis=1)
            visible_BRS = visible_BRS & (segment_BR[:, :, None] == self.key_segment_BS[:, None, :keys])
        return visible_BRS


def _block_visibility(visible, row0, size: int, keys: int, num_queries: int, causal: bool) -> jax.Array:
    """[B, size, keys] bool of a dense [B, L, S] visibility or a `KeyMask`, queries [row0, row0 + size)."""
    if isinstance(visible, KeyMask):
        return visible.block(row0, size, keys, num_queries, causal)
    return jax.lax.dynamic_slice_in_dim(visible[:, :, :keys], row0, size, axis=1)


def masked_scores(q_BLKGH, k_BKSH, visible_BLS) -> jax.Array:
    """q·kᵀ/√H [B, K, G, L, S] in float32, MASK_VALUE where a key is not visible."""
    scores_BKGLS = jnp.einsum("BLKGH,BKSH->BKGLS", q_BLKGH, k_BKSH, preferred_element_type=jnp.float32)
    scores_BKGLS = scores_BKGLS / jnp.sqrt(jnp.float32(q_BLKGH.shape[-1]))
    return jnp.where(visible_BLS[:, None, None, :, :], scores_BKGLS, MASK_VALUE)


def attend(q_BLKGH: jax.Array, k_BKSH: jax.Array, v_BKSH: jax.Array, visible_BLS: jax.Array, *,
           causal: bool = False, block_q: int | None = None, loop_above: int | None = None) -> jax.Array:
    """softmax(q kᵀ / √H + mask) v over all S keys, memory-light in the backward (see the module docstring).

    Args:
      q_BLKGH: [B, L, K, G, H] queries (G query heads per kv head), compute dtype.
      k_BKSH, v_BKSH: [B, K, S, H] keys (after RoPE) and values, compute dtype.
      visible_BLS: [B, L, S] bool, which keys each query sees, or a `KeyMask` (the same, in O(S) memory;
        with `causal` its causal part is built here; its `kernel` may send the call to a fused kernel).
      causal: the caller guarantees S >= L and that no query sees a later key: query l sits at key slot
        S − L + l (`visible[:, l, s]` False for s > S − L + l; S == L for self-attention); blocks then skip
        the keys after their last query. Not checked (it would cost a pass).
      block_q: queries per block (static; None: `block_rows` of the shapes, over `batch_rows` rows of the
        batch per loop, `loop_above` its threshold); L need not be a multiple.

    Returns:
      [B, L, K, G, H] output in v's dtype.
    """
    chex.assert_rank([q_BLKGH, k_BKSH, v_BKSH], [5, 4, 4])
    b, length, kv, _, h = q_BLKGH.shape
    chex.assert_equal_shape([k_BKSH, v_BKSH])
    chex.assert_shape(k_BKSH, (b, kv, None, h))
    if causal and k_BKSH.shape[2] < length:
        raise ValueError(f"causal attention needs at least as many keys as queries, got {k_BKSH.shape[2]} "
                         f"keys for {length} queries")
    if isinstance(visible_BLS, KeyMask):
        chex.assert_shape(visible_BLS.key_mask_BS, (b, k_BKSH.shape[2]))
        chex.assert_type(visible_BLS.key_mask_BS, bool)
        segmented = visible_BLS.query_segment_BL is not None
        if visible_BLS.kernel != "xla":
            from jaxrl.models import attention_fused

            if attention_fused.handles(visible_BLS.kernel, segmented):
                return attention_fused.attend_fused(q_BLKGH, k_BKSH, v_BKSH, visible_BLS.key_mask_BS,
                                                    causal=causal, kernel=visible_BLS.kernel,
                                                    segment_BS=visible_BLS.key_segment_BS)
    else:
        chex.assert_rank(visible_BLS, 3)
        chex.assert_shape(visible_BLS, (b, length, k_BKSH.shape[2]))
        chex.assert_type(visible_BLS, bool)
    if block_q is None:
        heads, num_keys = q_BLKGH.shape[2] * q_BLKGH.shape[3], k_BKSH.shape[2]
        rows = batch_rows(b, heads, num_keys, loop_above=loop_above)
        if rows < b:
            return _over_rows(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_rows(rows, heads, num_keys), rows)
        block_q = block_rows(b, heads, num_keys)
    if block_q < 1:
        raise ValueError(f"block_q must be positive, got {block_q}")
    return _attend(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q)


def _over_rows(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal: bool, block_q: int, rows: int) -> jax.Array:
    """`_attend` over the batch, `rows` consecutive rows per loop (`lax.map`; a `KeyMask` is split like any
    other batch-leading pytree). Rows are independent, so only the blocks' sizes and summation orders differ
    from one loop over the batch (ulps)."""
    n = q_BLKGH.shape[0] // rows
    split = lambda x: x.reshape((n, rows) + x.shape[1:])
    xs = jax.tree.map(split, (q_BLKGH, k_BKSH, v_BKSH, visible_BLS))
    out_NRLKGH = jax.lax.map(lambda x: _attend(*x, causal, block_q), xs)
    return out_NRLKGH.reshape(q_BLKGH.shape)


class _Group(NamedTuple):
    """`count` consecutive blocks of `size` queries from row `start`, each reading keys [0, keys)."""

    start: int
    size: int
    count: int
    keys: int


def _groups(length: int, num_keys: int, causal: bool, block_q: int) -> list[_Group]:
    """The blocks of both passes, in at most MAX_GROUPS + 1 groups; one group is one loop in the program.

    Causal: block b (rows up to r) needs keys [0, S − L + r); the full blocks are split into at most
    MAX_GROUPS groups of consecutive blocks, each reading the keys its last block needs (the extra keys are
    masked: at most about 1 / MAX_GROUPS more scores than skipping per block, none up to MAX_GROUPS blocks),
    and a last partial block is a group of its own. Not causal: every block reads all keys.
    """
    full, rest = divmod(length, block_q)
    offset = num_keys - length
    parts = min(full, MAX_GROUPS if causal else 1)
    groups, start = [], 0
    for part in range(parts):
        count = full // parts + (part < full % parts)
        end = start + count * block_q
        groups.append(_Group(start, block_q, count, offset + end if causal else num_keys))
        start = end
    if rest:
        groups.append(_Group(start, rest, 1, num_keys))
    return groups


def _over_blocks(group: _Group, block_fn, xs, carry=None):
    """`block_fn(row0, x, carry) -> (carry, out)` over the group's blocks, `x` the block's slice of `xs` (a tuple
    of [B, K, G, L, H] arrays, `_blocks_of`): one call, or a `lax.scan` whose outputs are stacked on a leading
    axis (a single call's get one too)."""
    if group.count == 1:
        carry, out = block_fn(group.start, tuple(x[0] for x in xs), carry)
        return carry, jax.tree.map(lambda a: a[None], out)
    rows = group.start + group.size * jnp.arange(group.count, dtype=jnp.int32)
    return jax.lax.scan(lambda c, row_x: block_fn(row_x[0], row_x[1], c), carry, (rows, xs))


def _blocks_of(x_BKGLH, group: _Group):
    """[count, B, K, G, size, H]: the group's query blocks, each a contiguous slice for the loop to read."""
    b, kv, g, _, h = x_BKGLH.shape
    rows = x_BKGLH[:, :, :, group.start:group.start + group.count * group.size]
    return jnp.moveaxis(rows.reshape(b, kv, g, group.count, group.size, h), 3, 0)


def _rows_from_blocks(x_NBKGRH):
    """[count, B, K, G, size, ...] -> [B, K, G, count · size, ...]: blocks back into rows."""
    x = jnp.moveaxis(x_NBKGRH, 0, 3)
    return x.reshape(x.shape[:3] + (x.shape[3] * x.shape[4],) + x.shape[5:])


def _scores(q_BKGRH, k_BKSH, visible_BRS):
    """q·kᵀ/√H [B, K, G, R, S] in float32, MASK_VALUE where a key is not visible (`masked_scores` with the
    queries' heads ahead of their rows: a batched matrix product without transposes)."""
    scores_BKGRS = jnp.einsum("BKGRH,BKSH->BKGRS", q_BKGRH, k_BKSH, preferred_element_type=jnp.float32)
    scores_BKGRS = scores_BKGRS / jnp.sqrt(jnp.float32(q_BKGRH.shape[-1]))
    return jnp.where(visible_BRS[:, None, None, :, :], scores_BKGRS, MASK_VALUE)


def _tail_sum(v_BKSH, keys: int):
    """[B, K, H] Σ_{s ≥ keys} v_s: the keys a block does not read, as a masked product (XLA:CPU made the
    slice-and-sum of each group a slow reduce-window)."""
    tail_S = (jnp.arange(v_BKSH.shape[2]) >= keys).astype(v_BKSH.dtype)
    return jnp.einsum("BKSH,S->BKH", v_BKSH, tail_S)


def _forward_stats(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q):
    """(out [B, L, K, G, H], row max m [B, K, G, L, 1], normaliser ℓ [B, K, G, L, 1]).

    A block reading `keys` < S keys adds the unread keys' exp(MASK_VALUE − m) to ℓ and their weight to the
    output: exactly 0 for a query that sees some key, exp(0) = 1 for one that sees none (then ℓ = S).
    """
    length, num_keys = q_BLKGH.shape[1], k_BKSH.shape[2]
    q_BKGLH = jnp.transpose(q_BLKGH, (0, 2, 3, 1, 4))
    outs, maxes, norms = [], [], []
    for group in _groups(length, num_keys, causal, block_q):
        size, keys = group.size, group.keys
        k_blk, v_blk = k_BKSH[:, :, :keys], v_BKSH[:, :, :keys]
        tail_BKH = _tail_sum(v_BKSH, keys) if keys < num_keys else None

        def block(row0, xs, carry, size=size, keys=keys, k_blk=k_blk, v_blk=v_blk, tail_BKH=tail_BKH):
            visible_BRS = _block_visibility(visible_BLS, row0, size, keys, length, causal)
            scores_BKGRS = _scores(xs[0], k_blk, visible_BRS)
            max_BKGR1 = jnp.max(scores_BKGRS, axis=-1, keepdims=True)
            unnormalized_BKGRS = jnp.exp(scores_BKGRS - max_BKGR1)
            norm_BKGR1 = jnp.sum(unnormalized_BKGRS, axis=-1, keepdims=True)
            if tail_BKH is not None:
                norm_BKGR1 = norm_BKGR1 + (num_keys - keys) * jnp.exp(MASK_VALUE - max_BKGR1)
            probs_BKGRS = (unnormalized_BKGRS / norm_BKGR1).astype(v_BKSH.dtype)
            out_BKGRH = jnp.einsum("BKGRS,BKSH->BKGRH", probs_BKGRS, v_blk)
            if tail_BKH is not None:
                unread_BKGR1 = (jnp.exp(MASK_VALUE - max_BKGR1) / norm_BKGR1).astype(v_BKSH.dtype)
                out_BKGRH = out_BKGRH + unread_BKGR1 * tail_BKH[:, :, None, None, :]
            return carry, (out_BKGRH, max_BKGR1, norm_BKGR1)

        _, stacked = _over_blocks(group, block, (_blocks_of(q_BKGLH, group),))
        for acc, x in zip((outs, maxes, norms), stacked):
            acc.append(_rows_from_blocks(x))
    out_BKGLH = jnp.concatenate(outs, 3)
    return jnp.transpose(out_BKGLH, (0, 3, 1, 2, 4)), jnp.concatenate(maxes, 3), jnp.concatenate(norms, 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attend(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q):
    return _forward_stats(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q)[0]


def _attend_fwd(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q):
    out_BLKGH, max_BKGL1, norm_BKGL1 = _forward_stats(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q)
    out_BLKGH, max_BKGL1, norm_BKGL1 = (checkpoint_name(x, name) for x, name in
                                        zip((out_BLKGH, max_BKGL1, norm_BKGL1), ATTENTION_CORE_NAMES))
    return out_BLKGH, (q_BLKGH, k_BKSH, v_BKSH, visible_BLS, max_BKGL1, norm_BKGL1)


def _attend_bwd(causal, block_q, residuals, dout_BLKGH):
    """dQ, dK, dV of the dense formula, block by block (equations in the module docstring)."""
    q_BLKGH, k_BKSH, v_BKSH, visible_BLS, max_BKGL1, norm_BKGL1 = residuals
    length, num_keys = q_BLKGH.shape[1], k_BKSH.shape[2]
    scale = jnp.sqrt(jnp.float32(q_BLKGH.shape[-1]))
    q_BKGLH = jnp.transpose(q_BLKGH, (0, 2, 3, 1, 4))
    dout_BKGLH = jnp.transpose(dout_BLKGH, (0, 2, 3, 1, 4))
    dqs = []
    dk_BKSH = jnp.zeros(k_BKSH.shape, jnp.float32)
    dv_BKSH = jnp.zeros(v_BKSH.shape, jnp.float32)
    for group in _groups(length, num_keys, causal, block_q):
        size, keys = group.size, group.keys
        k_blk, v_blk = k_BKSH[:, :, :keys], v_BKSH[:, :, :keys]

        def block(row0, xs, acc, size=size, keys=keys, k_blk=k_blk, v_blk=v_blk):
            """The block's dQ; dK and dV of the group's keys, and the unread keys' common dV, accumulated."""
            dk_read, dv_read, dv_tail_BKH = acc
            q_blk, dout_blk, max_blk, norm_blk = xs
            visible_blk = _block_visibility(visible_BLS, row0, size, keys, length, causal)
            scores_BKGRS = _scores(q_blk, k_blk, visible_blk)
            probs32_BKGRS = jnp.exp(scores_BKGRS - max_blk) / norm_blk
            probs_BKGRS = probs32_BKGRS.astype(v_BKSH.dtype)
            dv_read = dv_read + jnp.einsum("BKGRH,BKGRS->BKHS", dout_blk, probs_BKGRS)
            if keys < num_keys:  # the unread keys' weight (1/S for a query that sees no key, else 0)
                unread_BKGR = (jnp.exp(MASK_VALUE - max_blk) / norm_blk)[..., 0].astype(v_BKSH.dtype)
                dv_tail_BKH = dv_tail_BKH + jnp.einsum("BKGR,BKGRH->BKH", unread_BKGR, dout_blk)
            dprobs_BKGRS = jnp.einsum("BKGRH,BKSH->BKGRS", dout_blk, v_blk).astype(jnp.float32)
            weighted_BKGRS = probs32_BKGRS * dprobs_BKGRS
            dscores_BKGRS = weighted_BKGRS - probs32_BKGRS * jnp.sum(weighted_BKGRS, axis=-1, keepdims=True)
            dscores_BKGRS = jnp.where(visible_blk[:, None, None], dscores_BKGRS, 0.0) / scale
            dq_BKGRH = jnp.einsum("BKGRS,BKSH->BKGRH", dscores_BKGRS, k_blk,
                                  preferred_element_type=jnp.float32).astype(q_BLKGH.dtype)
            dk_read = dk_read + jnp.einsum("BKGRH,BKGRS->BKHS", q_blk, dscores_BKGRS,
                                           preferred_element_type=jnp.float32)
            return (dk_read, dv_read, dv_tail_BKH), dq_BKGRH

        transposed = lambda x: x.shape[:2] + (x.shape[3], x.shape[2])  # dK, dV accumulate as [B, K, H, S]
        zeros = (jnp.zeros(transposed(k_blk), jnp.float32), jnp.zeros(transposed(v_blk), jnp.float32),
                 jnp.zeros(v_blk.shape[:2] + v_blk.shape[3:], jnp.float32))
        xs = tuple(_blocks_of(x, group) for x in (q_BKGLH, dout_BKGLH, max_BKGL1, norm_BKGL1))
        (dk_read, dv_read, dv_tail_BKH), dq_NBKGRH = _over_blocks(group, block, xs, zeros)
        dqs.append(_rows_from_blocks(dq_NBKGRH))
        dk_BKSH = dk_BKSH.at[:, :, :keys].add(jnp.swapaxes(dk_read, 2, 3))
        dv_BKSH = dv_BKSH.at[:, :, :keys].add(jnp.swapaxes(dv_read, 2, 3))
        if keys < num_keys:
            dv_BKSH = dv_BKSH.at[:, :, keys:].add(dv_tail_BKH[:, :, None])
    dq_BLKGH = jnp.transpose(jnp.concatenate(dqs, 3), (0, 3, 1, 2, 4))
    return (dq_BLKGH, dk_BKSH.astype(k_BKSH.dtype), dv_BKSH.astype(v_BKSH.dtype), None)


_attend.defvjp(_attend_fwd, _attend_bwd)
