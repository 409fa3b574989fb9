"""Attention core of the full-sequence (training / scoring) forward, with a recomputing backward pass.

    out = softmax(q kᵀ / √H + mask) v,   mask = 0 where a key is visible, MASK_VALUE elsewhere.

Differentiating the dense formula keeps the float32 scores and probabilities [B, K, G, L, S] of every layer
for the backward pass; at L = 1024 that is 256 MiB per tensor and layer at B = 8 (benchmarks/RESULTS.md).
`attend` is a `jax.custom_vjp` in the manner of FlashAttention (Dao et al. 2022, arXiv:2205.14135): the
forward keeps q, k, v, the visibility mask and, per query, the row maximum m and the normaliser
ℓ = Σ_s exp(s − m) (O(L) each, where FlashAttention keeps logsumexp = m + log ℓ); the backward recomputes

    P = exp(S − m) / ℓ,   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − rowsum(P ∘ dP)),
    dQ = dS K / √H,       dK = dSᵀ Q / √H          (dS zero where a key is not visible).

Both passes run over static blocks of `block_q` queries, so that only one block's [B, K, G, block_q, S]
scores exist at a time. With `causal=True` (query l is the key at slot S − L + l and sees no later key, as in
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

from typing import Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
QUERY_BLOCK = 128  # 2-core CPU, L = 1024: 128 ran a training step faster than 256, 1024 (RESULTS.md)


@struct.dataclass
class KeyMask:
    """Which keys each query sees, in O(S) memory instead of a [B, L, S] tensor.

    Query l (at key slot S − L + l) sees key s iff the key is real, `key_mask_BS[b, s]`; with `causal` in
    `attend`, s ≤ S − L + l; with segments, `query_segment_BL[b, l] == key_segment_BS[b, s]`. This is the
    dense visibility `mask[:, None, :] & tril` of a padded (or packed) causal row, built one block of
    queries at a time, so that no [B, L, S] mask exists in the forward or is kept for the backward pass (at
    32k tokens the dense mask is 1 GiB per row).

    `kernel` picks the attention kernel (`Transformer.forward` sets it from `TransformerConfig.attention`):
    "xla", the blocked core below; "cudnn", `jax.nn.dot_product_attention`'s fused kernel
    (`jaxrl.models.attention_fused`; packed segments stay on "xla").
    """

    key_mask_BS: jax.Array
    query_segment_BL: Optional[jax.Array] = None
    key_segment_BS: Optional[jax.Array] = None
    kernel: str = struct.field(pytree_node=False, default="xla")

    def block(self, rows: slice, keys: int, num_queries: int, causal: bool) -> jax.Array:
        """[B, rows, keys] bool: visibility of queries `rows` over keys [0, keys)."""
        visible_BRS = jnp.broadcast_to(self.key_mask_BS[:, None, :keys],
                                       (self.key_mask_BS.shape[0], rows.stop - rows.start, keys))
        if causal:
            slots_R = jnp.arange(rows.start, rows.stop) + (self.key_mask_BS.shape[1] - num_queries)
            visible_BRS = visible_BRS & (jnp.arange(keys)[None, :] <= slots_R[:, None])[None]
        if self.query_segment_BL is not None:
            visible_BRS = visible_BRS & (self.query_segment_BL[:, rows, None]
                                         == self.key_segment_BS[:, None, :keys])
        return visible_BRS


def _block_visibility(visible, rows: slice, keys: int, num_queries: int, causal: bool) -> jax.Array:
    """[B, rows, keys] bool of a dense [B, L, S] visibility or a `KeyMask`."""
    if isinstance(visible, KeyMask):
        return visible.block(rows, keys, num_queries, causal)
    return visible[:, rows, :keys]


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
        if visible_BLS.kernel != "xla" and visible_BLS.query_segment_BL is None:
            from jaxrl.models.attention_fused import attend_fused

            return attend_fused(q_BLKGH, k_BKSH, v_BKSH, visible_BLS.key_mask_BS, causal=causal,
                                kernel=visible_BLS.kernel)
    else:
        chex.assert_rank(visible_BLS, 3)
        chex.assert_shape(visible_BLS, (b, length, k_BKSH.shape[2]))
        chex.assert_type(visible_BLS, bool)
    if block_q < 1:
        raise ValueError(f"block_q must be positive, got {block_q}")
    return _attend(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q)


def _blocks(length: int, num_keys: int, causal: bool, block_q: int) -> list[tuple[slice, int]]:
    """(query rows, number of keys read) per block; causal: query l sits at key slot S − L + l."""
    offset = num_keys - length
    return [(slice(start, min(start + block_q, length)),
             offset + min(start + block_q, length) if causal else num_keys)
            for start in range(0, length, block_q)]


def _forward_stats(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal, block_q):
    """(out [B, L, K, G, H], row max m [B, K, G, L, 1], normaliser ℓ [B, K, G, L, 1]).

    A block reading `keys` < S keys adds the unread keys' exp(MASK_VALUE − m) to ℓ and their weight to the
    output: exactly 0 for a query that sees some key, exp(0) = 1 for one that sees none (then ℓ = S).
    """
    num_keys = k_BKSH.shape[2]
    outs, maxes, norms = [], [], []
    for rows, keys in _blocks(q_BLKGH.shape[1], num_keys, causal, block_q):
        visible_BRS = _block_visibility(visible_BLS, rows, keys, q_BLKGH.shape[1], causal)
        scores_BKGLS = masked_scores(q_BLKGH[:, rows], k_BKSH[:, :, :keys], visible_BRS)
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
        outs.append(out_BLKGH)
        maxes.append(max_BKGL1)
        norms.append(norm_BKGL1)
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
    num_keys = k_BKSH.shape[2]
    scale = jnp.sqrt(jnp.float32(q_BLKGH.shape[-1]))
    dqs = []
    dk_BKSH = jnp.zeros(k_BKSH.shape, jnp.float32)
    dv_BKSH = jnp.zeros(v_BKSH.shape, jnp.float32)
    for rows, keys in _blocks(q_BLKGH.shape[1], num_keys, causal, block_q):
        q_blk, dout_blk = q_BLKGH[:, rows], dout_BLKGH[:, rows]
        visible_blk = _block_visibility(visible_BLS, rows, keys, q_BLKGH.shape[1], causal)
        k_blk, v_blk = k_BKSH[:, :, :keys], v_BKSH[:, :, :keys]
        max_blk, norm_blk = max_BKGL1[:, :, :, rows], norm_BKGL1[:, :, :, rows]
        scores_BKGLS = masked_scores(q_blk, k_blk, visible_blk)
        probs32_BKGLS = jnp.exp(scores_BKGLS - max_blk) / norm_blk
        probs_BKGLS = probs32_BKGLS.astype(v_BKSH.dtype)
        dv_BKSH = dv_BKSH.at[:, :, :keys].add(jnp.einsum("BKGLS,BLKGH->BKSH", probs_BKGLS, dout_blk))
        if keys < num_keys:  # the unread keys' weight (1/S for a query that sees no key, else 0)
            unread_BKGL = (jnp.exp(MASK_VALUE - max_blk) / norm_blk)[..., 0].astype(v_BKSH.dtype)
            dv_tail_BKH = jnp.einsum("BKGL,BLKGH->BKH", unread_BKGL, dout_blk)
            dv_BKSH = dv_BKSH.at[:, :, keys:].add(dv_tail_BKH[:, :, None].astype(jnp.float32))
        dprobs_BKGLS = jnp.einsum("BLKGH,BKSH->BKGLS", dout_blk, v_blk).astype(jnp.float32)
        weighted_BKGLS = probs32_BKGLS * dprobs_BKGLS
        dscores_BKGLS = weighted_BKGLS - probs32_BKGLS * jnp.sum(weighted_BKGLS, axis=-1, keepdims=True)
        dscores_BKGLS = jnp.where(visible_blk[:, None, None], dscores_BKGLS, 0.0) / scale
        dqs.append(jnp.einsum("BKGLS,BKSH->BLKGH", dscores_BKGLS, k_blk,
                              preferred_element_type=jnp.float32).astype(q_BLKGH.dtype))
        dk_BKSH = dk_BKSH.at[:, :, :keys].add(jnp.einsum("BKGLS,BLKGH->BKSH", dscores_BKGLS, q_blk,
                                                         preferred_element_type=jnp.float32))
    return (jnp.concatenate(dqs, 1), dk_BKSH.astype(k_BKSH.dtype), dv_BKSH.astype(v_BKSH.dtype), None)


_attend.defvjp(_attend_fwd, _attend_bwd)
