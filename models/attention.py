"""Attention core of the full-sequence (training / scoring) forward, with a recomputing backward pass.

    out = softmax(q kᵀ / √H + mask) v,   mask = 0 where a key is visible, MASK_VALUE elsewhere.

Differentiating the dense formula keeps the float32 scores and probabilities [B, K, G, L, S] of every layer
for the backward pass; at L = 1024 that is 256 MiB per tensor and layer at B = 8 (benchmarks/RESULTS.md).
`attend` is a `jax.custom_vjp` in the manner of FlashAttention (Dao et al. 2022, arXiv:2205.14135): the
forward keeps q, k, v, the visibility mask and, per query, the row maximum m and the normaliser
ℓ = Σ_s exp(s − m) (O(L) each, where FlashAttention keeps logsumexp = m + log ℓ); the backward recomputes

    P = exp(S − m) / ℓ,   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − rowsum(P ∘ dP)),
    dQ = dS K / √H,       dK = dSᵀ Q / √H          (dS zero where a key is not visible).

Both passes run over blocks of `block_q` queries, so that only one block's [B, K, G, block_q, S] scores
exist at a time; past MAX_GROUPS blocks, consecutive blocks run as one `lax.scan` (`_groups`), so the
program, and its compile time, stop growing with L (on a 2-core CPU, forward + backward at L = 8192: 70 s
to compile with 64 unrolled blocks, 14 s in 16 loops; 32768: 342 s and 11 s; the run time did not grow). With `causal=True` (query l is the key at slot S − L + l and sees no later key, as in
a causal LM's full-sequence forward, S = L, or a completion attending over [shared prompt keys | its own
keys], `jaxrl.models.shared_prompt`) a block of queries ending at row r reads keys [0, S − L + r) only, which
skips about half of the self-attention scores; a query with no visible key still gets the dense result (its
unread keys carry the same weight 1/S).

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

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
QUERY_BLOCK = 128  # 2-core CPU, L = 1024: 128 ran a training step faster than 256, 1024 (RESULTS.md)
# Loops per pass at most (+1 for a partial block): the program's size, and its compile time, stop growing
# with L (64 unrolled blocks took 70 s to compile on this CPU at L = 8192, and longer on a GPU).
MAX_GROUPS = 16


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
           causal: bool = False, block_q: int = QUERY_BLOCK) -> jax.Array:
    """softmax(q kᵀ / √H + mask) v over all S keys, memory-light in the backward (see the module docstring).

    Args:
      q_BLKGH: [B, L, K, G, H] queries (G query heads per kv head), compute dtype.
      k_BKSH, v_BKSH: [B, K, S, H] keys (after RoPE) and values, compute dtype.
      visible_BLS: [B, L, S] bool, which keys each query sees, or a `KeyMask` (the same, in O(S) memory;
        with `causal` its causal part is built here; its `kernel` may send the call to a fused kernel).
      causal: the caller guarantees S >= L and that no query sees a later key: query l sits at key slot
        S − L + l (`visible[:, l, s]` False for s > S − L + l; S == L for self-attention); blocks then skip
        the keys after their last query. Not checked (it would cost a pass).
      block_q: queries per block (static); L need not be a multiple.

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
    if block_q < 1:
        raise ValueError(f"block_q must be positive, got {block_q}")
    return _attend(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q)


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


def _over_blocks(group: _Group, block_fn, carry=None):
    """`block_fn(row0, carry) -> (carry, out)` over the group's blocks: one call, or a `lax.scan` whose
    outputs are stacked on a leading axis (a single call's get one too)."""
    if group.count == 1:
        carry, out = block_fn(group.start, carry)
        return carry, jax.tree.map(lambda a: a[None], out)
    rows = group.start + group.size * jnp.arange(group.count, dtype=jnp.int32)
    return jax.lax.scan(lambda c, row0: block_fn(row0, c), carry, rows)


def _unstack_rows(x, axis: int):
    """[count, ..., size (at `axis` + 1), ...] -> [..., count · size, ...]: blocks back into rows."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:])


def _rows_of(x, row0, size: int, axis: int):
    return jax.lax.dynamic_slice_in_dim(x, row0, size, axis=axis)


def _forward_stats(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q):
    """(out [B, L, K, G, H], row max m [B, K, G, L, 1], normaliser ℓ [B, K, G, L, 1]).

    A block reading `keys` < S keys adds the unread keys' exp(MASK_VALUE − m) to ℓ and their weight to the
    output: exactly 0 for a query that sees some key, exp(0) = 1 for one that sees none (then ℓ = S).
    """
    length, num_keys = q_BLKGH.shape[1], k_BKSH.shape[2]
    outs, maxes, norms = [], [], []
    for group in _groups(length, num_keys, causal, block_q):
        size, keys = group.size, group.keys

        def block(row0, carry, size=size, keys=keys):
            visible_BRS = _block_visibility(visible_BLS, row0, size, keys, length, causal)
            scores_BKGLS = masked_scores(_rows_of(q_BLKGH, row0, size, 1), k_BKSH[:, :, :keys], visible_BRS)
            max_BKGL1 = jnp.max(scores_BKGLS, axis=-1, keepdims=True)
            unnormalized_BKGLS = jnp.exp(scores_BKGLS - max_BKGL1)
            norm_BKGL1 = jnp.sum(unnormalized_BKGLS, axis=-1, keepdims=True)
            if keys < num_keys:
                norm_BKGL1 = norm_BKGL1 + (num_keys - keys) * jnp.exp(MASK_VALUE - max_BKGL1)
            probs_BKGLS = (unnormalized_BKGLS / norm_BKGL1).astype(v_BKSH.dtype)
            out_BLKGH = jnp.einsum("BKGLS,BKSH->BLKGH", probs_BKGLS, v_BKSH[:, :, :keys])
            if keys < num_keys:
                unread_BKGL = (jnp.exp(MASK_VALUE - max_BKGL1) / norm_BKGL1)[..., 0].astype(v_BKSH.dtype)
                out_BLKGH = out_BLKGH + jnp.einsum("BKGL,BKH->BLKGH", unread_BKGL,
                                                   jnp.sum(v_BKSH[:, :, keys:], axis=2))
            return carry, (out_BLKGH, max_BKGL1, norm_BKGL1)

        _, (out_NBLKGH, max_NBKGL1, norm_NBKGL1) = _over_blocks(group, block)
        outs.append(_unstack_rows(out_NBLKGH, 1))
        maxes.append(_unstack_rows(max_NBKGL1, 3))
        norms.append(_unstack_rows(norm_NBKGL1, 3))
    return jnp.concatenate(outs, 1), jnp.concatenate(maxes, 3), jnp.concatenate(norms, 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attend(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q):
    return _forward_stats(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q)[0]


def _attend_fwd(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q):
    out_BLKGH, max_BKGL1, norm_BKGL1 = _forward_stats(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q)
    return out_BLKGH, (q_BLKGH, k_BKSH, v_BKSH, visible_BLS, max_BKGL1, norm_BKGL1)


def _attend_bwd(causal, block_q, residuals, dout_BLKGH):
    """dQ, dK, dV of the dense formula, block by block (equations in the module docstring)."""
    q_BLKGH, k_BKSH, v_BKSH, visible_BLS, max_BKGL1, norm_BKGL1 = residuals
    length, num_keys = q_BLKGH.shape[1], k_BKSH.shape[2]
    scale = jnp.sqrt(jnp.float32(q_BLKGH.shape[-1]))
    dqs = []
    dk_BKSH = jnp.zeros(k_BKSH.shape, jnp.float32)
    dv_BKSH = jnp.zeros(v_BKSH.shape, jnp.float32)
    for group in _groups(length, num_keys, causal, block_q):
        size, keys = group.size, group.keys
        k_blk, v_blk = k_BKSH[:, :, :keys], v_BKSH[:, :, :keys]

        def block(row0, acc, size=size, keys=keys, k_blk=k_blk, v_blk=v_blk):
            """The block's dQ; dK and dV of the group's keys, and the unread keys' common dV, accumulated."""
            dk_read, dv_read, dv_tail_BKH = acc
            q_blk, dout_blk = _rows_of(q_BLKGH, row0, size, 1), _rows_of(dout_BLKGH, row0, size, 1)
            visible_blk = _block_visibility(visible_BLS, row0, size, keys, length, causal)
            max_blk, norm_blk = _rows_of(max_BKGL1, row0, size, 3), _rows_of(norm_BKGL1, row0, size, 3)
            scores_BKGLS = masked_scores(q_blk, k_blk, visible_blk)
            probs32_BKGLS = jnp.exp(scores_BKGLS - max_blk) / norm_blk
            probs_BKGLS = probs32_BKGLS.astype(v_BKSH.dtype)
            dv_read = dv_read + jnp.einsum("BKGLS,BLKGH->BKSH", probs_BKGLS, dout_blk)
            if keys < num_keys:  # the unread keys' weight (1/S for a query that sees no key, else 0)
                unread_BKGL = (jnp.exp(MASK_VALUE - max_blk) / norm_blk)[..., 0].astype(v_BKSH.dtype)
                dv_tail_BKH = dv_tail_BKH + jnp.einsum("BKGL,BLKGH->BKH", unread_BKGL, dout_blk)
            dprobs_BKGLS = jnp.einsum("BLKGH,BKSH->BKGLS", dout_blk, v_blk).astype(jnp.float32)
            weighted_BKGLS = probs32_BKGLS * dprobs_BKGLS
            dscores_BKGLS = weighted_BKGLS - probs32_BKGLS * jnp.sum(weighted_BKGLS, axis=-1, keepdims=True)
            dscores_BKGLS = jnp.where(visible_blk[:, None, None], dscores_BKGLS, 0.0) / scale
            dq_BLKGH = jnp.einsum("BKGLS,BKSH->BLKGH", dscores_BKGLS, k_blk,
                                  preferred_element_type=jnp.float32).astype(q_BLKGH.dtype)
            dk_read = dk_read + jnp.einsum("BKGLS,BLKGH->BKSH", dscores_BKGLS, q_blk,
                                           preferred_element_type=jnp.float32)
            return (dk_read, dv_read, dv_tail_BKH), dq_BLKGH

        zeros = (jnp.zeros(k_blk.shape, jnp.float32), jnp.zeros(v_blk.shape, jnp.float32),
                 jnp.zeros(v_blk.shape[:2] + v_blk.shape[3:], jnp.float32))
        (dk_read, dv_read, dv_tail_BKH), dq_NBLKGH = _over_blocks(group, block, zeros)
        dqs.append(_unstack_rows(dq_NBLKGH, 1))
        dk_BKSH = dk_BKSH.at[:, :, :keys].add(dk_read)
        dv_BKSH = dv_BKSH.at[:, :, :keys].add(dv_read)
        if keys < num_keys:
            dv_BKSH = dv_BKSH.at[:, :, keys:].add(dv_tail_BKH[:, :, None])
    return (jnp.concatenate(dqs, 1), dk_BKSH.astype(k_BKSH.dtype), dv_BKSH.astype(v_BKSH.dtype), None)


_attend.defvjp(_attend_fwd, _attend_bwd)
