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

**Splash** (TPU): Pallas splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`, the kernel
MaxText and Tunix use) takes segment ids and a causal mask with an offset, so no compaction is needed: a real
token's segment is its packed segment (0 in an unpacked row), padding is segment −1, and query l sits at
key slot S − L + l (`CausalMask(offset=S − L)`). A real query then sees exactly the real keys of its segment
at slots ≤ its own; a padding query sees padding keys only (output dropped: 0, as with cuDNN). Sequences are
padded at the end to whole blocks of SPLASH_BLOCK (padding segment), GQA runs as multi-query attention per kv
head (`make_splash_mqa`), and q is scaled by 1/√H before the kernel, which scales nothing itself. On CPU the
same kernel runs in Pallas' interpret mode (tests/models/test_attention_fused.py).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

KERNELS = ("xla", "cudnn", "splash")  # TransformerConfig.attention; "xla": the blocked `attention.attend`
HALF_DTYPES = ("bfloat16", "float16")  # what cuDNN flash attention computes in
# what `jax.nn.dot_product_attention` runs for each fused kernel (tests on CPU swap in "xla", JAX's reference)
IMPLEMENTATIONS = {"cudnn": "cudnn"}
SPLASH_BLOCK = 128  # query and key block of the splash kernel (TPU lanes); sequences are padded to a multiple
SPLASH_INTERPRET = {"interpret": False}  # Pallas interpret mode: tests on CPU set True


def handles(kernel: str, segmented: bool) -> bool:
    """Whether `attend_fused` computes this visibility with `kernel` (else the blocked core does)."""
    return kernel == "splash" or (kernel == "cudnn" and not segmented)


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
                 implementation: str | None = None, segment_BS=None) -> jax.Array:
    """softmax(q kᵀ / √H + mask) v with `jax.nn.dot_product_attention`, the visibility of a `KeyMask`
    without segments (see the module docstring).

    Args:
      q_BLKGH: [B, L, K, G, H] queries; query l sits at key slot S − L + l.
      k_BKSH, v_BKSH: [B, K, S, H] keys (after RoPE) and values, S ≥ L.
      key_mask_BS: [B, S] bool, the real keys.
      causal: must be True (every full-sequence forward of a causal LM).
      kernel: "cudnn" or "splash".
      implementation: what `jax.nn.dot_product_attention` runs, default the kernel's own; tests on CPU pass
        "xla" (JAX's reference of the same call) to check the compaction. Not used by splash.
      segment_BS: None, or [B, S] int segment ids of packed rows (splash only; queries and keys share them).

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
    if kernel == "splash":
        return _attend_splash(q_BLKGH, k_BKSH, v_BKSH, key_mask_BS, segment_BS)
    if segment_BS is not None:
        raise ValueError("cudnn attention takes no segment ids: packed rows run the blocked core")
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


def _attend_splash(q_BLKGH, k_BKSH, v_BKSH, key_mask_BS, segment_BS):
    """Splash attention of a causal `KeyMask` (module docstring), [B, L, K, G, H], 0 at padding queries."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

    b, length, kv, g, h = q_BLKGH.shape
    slots = k_BKSH.shape[2]
    padded_l, padded_s = (-(-n // SPLASH_BLOCK) * SPLASH_BLOCK for n in (length, slots))
    segment_BS = jnp.zeros(key_mask_BS.shape, jnp.int32) if segment_BS is None else segment_BS.astype(jnp.int32)
    segment_BS = jnp.pad(jnp.where(key_mask_BS, segment_BS, -1), ((0, 0), (0, padded_s - slots)),
                         constant_values=-1)
    query_segment_BL = jnp.pad(segment_BS[:, slots - length:slots], ((0, 0), (0, padded_l - length)),
                               constant_values=-1)
    scale = jnp.asarray(1.0 / float(h) ** 0.5, q_BLKGH.dtype)
    q_BKGLH = jnp.pad((q_BLKGH * scale).transpose(0, 2, 3, 1, 4),
                      ((0, 0), (0, 0), (0, 0), (0, padded_l - length), (0, 0)))
    k_BKSH, v_BKSH = (jnp.pad(x, ((0, 0), (0, 0), (0, padded_s - slots), (0, 0))) for x in (k_BKSH, v_BKSH))
    causal = splash_mask.CausalMask((padded_l, padded_s), offset=slots - length)
    sizes = splash.BlockSizes(block_q=SPLASH_BLOCK, block_kv=SPLASH_BLOCK, block_kv_compute=SPLASH_BLOCK,
                              block_q_dkv=SPLASH_BLOCK, block_kv_dkv=SPLASH_BLOCK,
                              block_kv_dkv_compute=SPLASH_BLOCK, block_q_dq=SPLASH_BLOCK, block_kv_dq=SPLASH_BLOCK)
    kernel = splash.make_splash_mqa(splash_mask.MultiHeadMask([causal] * g), block_sizes=sizes, head_shards=1,
                                    q_seq_shards=1, interpret=SPLASH_INTERPRET["interpret"])

    def row(q_KGLH, k_KSH, v_KSH, q_seg_L, kv_seg_S):
        ids = splash.SegmentIds(q=q_seg_L, kv=kv_seg_S)
        return jax.vmap(lambda q_GLH, k_SH, v_SH: kernel(q_GLH, k_SH, v_SH, segment_ids=ids))(q_KGLH, k_KSH, v_KSH)

    out_BKGLH = jax.vmap(row)(q_BKGLH, k_BKSH, v_BKSH, query_segment_BL, segment_BS)
    out_BLKGH = out_BKGLH[:, :, :, :length].transpose(0, 3, 1, 2, 4)
    real_BL = key_mask_BS[:, slots - length:]
    return jnp.where(real_BL[:, :, None, None, None], out_BLKGH, jnp.zeros((), out_BLKGH.dtype)).astype(
        v_BKSH.dtype)
