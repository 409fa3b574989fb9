"""Causal attention through `jax.nn.dot_product_attention`'s fused kernel (cuDNN flash attention on GPU).

The fused kernels take padding only as lengths (`query_seq_lengths`, `key_value_seq_lengths`: the first n
tokens of a row are real) and causality only aligned top-left (query t sees keys 0 … t). jaxrl's rows are
not of that form: prompts are left-padded, a shared-prompt completion's queries sit after its prompt keys
(`jaxrl.models.shared_prompt`). Each row is therefore *compacted* first, exactly:

    perm = argsort(not key_mask, stable)      real keys first, in their order; padding after
    n    = Σ key_mask                         the row's real keys
    out  = unpermute(attention(q[perm], k[perm], v[perm], causal, lengths n))

A real query at slot j sees the real keys at slots ≤ j before compaction and, after it, the real keys at
compacted indices ≤ (its own compacted index): the same keys, in the same order, so the softmax is the
same up to the kernel's summation order. With fewer queries than keys (L < S, query l at slot S − L + l)
the query sequence is padded in front with S − L zero queries, whose outputs are dropped. A padding query
(its own slot is not a real key) gets output 0 here; the blocked core (`attention.attend`) gives it finite
garbage instead. No real position reads either, so hidden states at real positions agree.

Packed rows (segment ids) stay on the blocked core: `jax.nn.dot_product_attention` takes no segment ids.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

KERNELS = ("xla", "cudnn")  # TransformerConfig.attention; "xla" is the blocked core of `attention.attend`
HALF_DTYPES = ("bfloat16", "float16")  # what cuDNN flash attention computes in
# what `jax.nn.dot_product_attention` runs for each fused kernel (tests on CPU swap in "xla", JAX's reference)
IMPLEMENTATIONS = {"cudnn": "cudnn"}


def compaction_BS(key_mask_BS: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(perm [B, S], inverse [B, S], real keys n [B] int32, at least 1): x[perm] puts a row's real keys
    first in their order; y[inverse] undoes it."""
    perm_BS = jnp.argsort(~key_mask_BS, axis=1, stable=True)
    inverse_BS = jnp.argsort(perm_BS, axis=1)
    # a row without a real key attends to one padding key: finite, and no real position reads it
    count_B = jnp.maximum(jnp.sum(key_mask_BS, axis=1, dtype=jnp.int32), 1)
    return perm_BS, inverse_BS, count_B


def _rows(x_BS__, index_BS):
    return jnp.take_along_axis(x_BS__, index_BS.reshape(index_BS.shape + (1,) * (x_BS__.ndim - 2)), axis=1)


def attend_fused(q_BLKGH, k_BKSH, v_BKSH, key_mask_BS, *, causal: bool, kernel: str,
                 implementation: str | None = None) -> jax.Array:
    """softmax(q kᵀ / √H + mask) v with `jax.nn.dot_product_attention`, the visibility of a `KeyMask`
    without segments (see the module docstring).

    Args:
      q_BLKGH: [B, L, K, G, H] queries; query l sits at key slot S − L + l.
      k_BKSH, v_BKSH: [B, K, S, H] keys (after RoPE) and values, S ≥ L.
      key_mask_BS: [B, S] bool, the real keys.
      causal: must be True (every full-sequence forward of a causal LM).
      kernel: "cudnn".
      implementation: what `jax.nn.dot_product_attention` runs, default the kernel's own; tests on CPU pass
        "xla" (JAX's reference of the same call) to check the compaction.

    Returns:
      [B, L, K, G, H] in v's dtype; 0 at padding queries.
    """
    chex.assert_rank([q_BLKGH, k_BKSH, v_BKSH, key_mask_BS], [5, 4, 4, 2])
    if not causal or kernel not in KERNELS[1:]:
        raise ValueError(f"attend_fused runs causal attention with kernel in {KERNELS[1:]}, got "
                         f"causal={causal}, kernel={kernel!r}")
    b, length, kv, g, h = q_BLKGH.shape
    slots = k_BKSH.shape[2]
    chex.assert_shape(key_mask_BS, (b, slots))
    if slots < length:
        raise ValueError(f"{length} queries over {slots} keys: a query needs its own key slot")
    perm_BS, inverse_BS, count_B = compaction_BS(key_mask_BS)
    q_BLNH = q_BLKGH.reshape(b, length, kv * g, h)  # head n = k·G + g, the grouping jax.nn uses
    if slots > length:
        q_BLNH = jnp.concatenate([jnp.zeros((b, slots - length, kv * g, h), q_BLNH.dtype), q_BLNH], axis=1)
    k_BSKH, v_BSKH = (x.transpose(0, 2, 1, 3) for x in (k_BKSH, v_BKSH))
    out_BSNH = jax.nn.dot_product_attention(
        _rows(q_BLNH, perm_BS), _rows(k_BSKH, perm_BS), _rows(v_BSKH, perm_BS), is_causal=True,
        query_seq_lengths=count_B, key_value_seq_lengths=count_B,
        implementation=IMPLEMENTATIONS[kernel] if implementation is None else implementation)
    out_BLNH = _rows(out_BSNH, inverse_BS)[:, slots - length:]
    real_BL = key_mask_BS[:, slots - length:]
    out_BLNH = jnp.where(real_BL[:, :, None, None], out_BLNH, jnp.zeros((), out_BLNH.dtype))
    return out_BLNH.reshape(b, length, kv, g, h).astype(v_BKSH.dtype)
