"""Layers shared by every variant: RMSNorm, RoPE, grouped-query Attention, SwiGLU MLP, embedding.

Each module takes explicit sizes, then keyword-only `rngs` and dtypes; none of them sees a
`TransformerConfig`.
Every parameter is built with `jaxrl.sharding.param` and carries logical axis names.

Deviations from / choices against the Hugging Face reference (`modeling_llama.py`, `modeling_qwen3.py`):
* Linear weights are stored input-major and split per head (`q_proj.kernel` is `[D, N, H]`, HF `[N·H, D]`), so
  projections are einsums and the head axis can be sharded by name.
* Attention scores and softmax are float32 whatever the compute dtype; masked scores are a large negative
  *finite* value, so a query with no visible key (a padding query) yields finite garbage instead of NaN.
* Without a cache (training, scoring) the attention core is `jaxrl.models.attention.attend`: the same
  numerics, with a recomputing backward pass that keeps no [B, K, G, L, L] scores or probabilities per layer.
* RoPE inverse frequencies are computed once in numpy float32 with the same operations as HF, so positions
  rotate identically.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxrl.models.attention import MASK_VALUE, attend, masked_scores  # noqa: F401 (MASK_VALUE re-exported)
from jaxrl.models.config import Llama3RopeScaling
from jaxrl.models.shared_prompt import GroupVisibility, attend_groups
from jaxrl.models.unpadded import Unpadded, attend_unpadded
from jaxrl.sharding import param

_INIT_STD = 0.02  # HF `initializer_range` default for Llama/Qwen


def _normal(rngs: nnx.Rngs, shape, dtype) -> jax.Array:
    return (_INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


class RMSNorm(nnx.Module):
    """Root-mean-square norm: y = x · rsqrt(mean(x²) + ε) · w (Zhang & Sennrich 2019, arXiv:1910.07467).

    Computed in float32, cast back to the input dtype before the weight multiplies it, as in HF.
    """

    def __init__(self, dim: int, *, eps: float, param_dtype=jnp.float32, names=("embed",)):
        self.eps = eps
        self.weight = param(jnp.ones((dim,), param_dtype), names)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[Llama3RopeScaling]) -> np.ndarray:
    """RoPE inverse frequencies [H/2] (float32), θ^(-2i/H), with optional Llama-3 scaling.

    RoFormer, arXiv:2104.09864; Llama-3 scaling as in HF `_compute_llama3_parameters`: wavelengths above
    `orig/low_freq_factor` are divided by `factor`, below `orig/high_freq_factor` kept, and interpolated
    between.
    """
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)
    if scaling is None:
        return inv_freq
    orig = float(scaling.original_max_position_embeddings)
    low_wavelen = orig / scaling.low_freq_factor
    high_wavelen = orig / scaling.high_freq_factor
    wavelen = (2 * math.pi / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(scaling.factor), inv_freq)
    scaled = scaled.astype(np.float32)
    smooth = ((orig / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(scaling.factor) + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(positions_BL: jax.Array, inv_freq: np.ndarray, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, L, H] for integer positions, HF layout (frequencies repeated: `cat(f, f)`)."""
    angles_BLh = positions_BL.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    angles_BLH = jnp.concatenate([angles_BLh, angles_BLh], axis=-1)
    return jnp.cos(angles_BLH).astype(dtype), jnp.sin(angles_BLH).astype(dtype)


def apply_rope(x_BLNH: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array) -> jax.Array:
    """x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x₂, x₁) (HF convention, halves not interleaved)."""
    half = x_BLNH.shape[-1] // 2
    rotated = jnp.concatenate([-x_BLNH[..., half:], x_BLNH[..., :half]], axis=-1)
    return x_BLNH * cos_BLH[:, :, None, :] + rotated * sin_BLH[:, :, None, :]


class Proj(nnx.Module):
    """A linear map written as an einsum over named kernel axes, optional bias over the output axes."""

    def __init__(self, kernel_shape, names, equation: str, *, num_in: int, bias: bool, rngs: nnx.Rngs,
                 dtype=jnp.float32, param_dtype=jnp.float32):
        self.equation = equation
        self.dtype = dtype
        self.kernel = param(_normal(rngs, tuple(kernel_shape), param_dtype), names)
        if bias:
            self.bias = param(jnp.zeros(tuple(kernel_shape)[num_in:], param_dtype), names[num_in:])
        else:
            self.bias = None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.einsum(self.equation, x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class Embed(nnx.Module):
    """Token embedding table [V, D]; `attend` gives logits against it (tied head)."""

    def __init__(self, vocab_size: int, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        self.dtype = dtype
        self.embedding = param(_normal(rngs, (vocab_size, dim), param_dtype), ("vocab", "embed"))

    def __call__(self, tokens_BL: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], tokens_BL, axis=0).astype(self.dtype)


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(x·W_gate) ⊙ x·W_up) (Shazeer 2020, arXiv:2002.05202)."""

    def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, num_in=1, bias=False)
        self.gate_proj = Proj((dim, hidden), ("embed", "mlp"), "BLD,DF->BLF", **kw)
        self.up_proj = Proj((dim, hidden), ("embed", "mlp"), "BLD,DF->BLF", **kw)
        self.down_proj = Proj((hidden, dim), ("mlp", "embed"), "BLF,FD->BLD", **kw)

    def __call__(self, x_BLD: jax.Array, norm: Optional[RMSNorm] = None, keep_projections: bool = True
                 ) -> jax.Array:
        """MLP(norm(x)), or MLP(x) without `norm`.

        The backward pass keeps the two [B, L, F] projections and recomputes silu(gate) ⊙ up from them
        (elementwise) instead of also keeping the product: once attention keeps no [L, L] tensor, the MLP's
        activations are the largest residuals of a long-sequence training step (benchmarks/RESULTS.md). A
        pre-norm block passes its norm here, so that it runs inside the same checkpoint: the backward keeps x
        and recomputes norm(x) (elementwise) instead of keeping the norm's [B, L, D] output and its unweighted
        normalised input. Without `keep_projections` (`model.remat: mlp`) it keeps only x and recomputes the
        two projections too: 2 of the MLP's 3 matmuls again, for 2 x [B, L, F] less memory per layer."""
        def swiglu(x_BLD):
            u_BLD = x_BLD if norm is None else norm(x_BLD)
            gate_BLF = checkpoint_name(self.gate_proj(u_BLD), "mlp_gate")
            up_BLF = checkpoint_name(self.up_proj(u_BLD), "mlp_up")
            return self.down_proj(jax.nn.silu(gate_BLF) * up_BLF)

        policy = _KEEP_PROJECTIONS if keep_projections else jax.checkpoint_policies.nothing_saveable
        return jax.checkpoint(swiglu, policy=policy)(x_BLD)


_KEEP_PROJECTIONS = jax.checkpoint_policies.save_only_these_names("mlp_gate", "mlp_up")


class Attention(nnx.Module):
    """Grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245) with RoPE.

    softmax(q kᵀ / √H + mask) v, where each of the K kv heads serves N/K query heads. Options: q/k/v bias
    (Qwen2) and RMSNorm of q and k over H before RoPE (Qwen3).
    """

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, head_dim: int, *, qkv_bias: bool,
                 qk_norm: bool, eps: float, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dtype = dtype
        self.q_proj = Proj((dim, num_heads, head_dim), ("embed", "heads", "head_dim"), "BLD,DNH->BLNH",
                           num_in=1, bias=qkv_bias, **kw)
        self.k_proj = Proj((dim, num_kv_heads, head_dim), ("embed", "kv_heads", "head_dim"),
                           "BLD,DKH->BLKH", num_in=1, bias=qkv_bias, **kw)
        self.v_proj = Proj((dim, num_kv_heads, head_dim), ("embed", "kv_heads", "head_dim"),
                           "BLD,DKH->BLKH", num_in=1, bias=qkv_bias, **kw)
        self.o_proj = Proj((num_heads, head_dim, dim), ("heads", "head_dim", "embed"), "BLNH,NHD->BLD",
                           num_in=2, bias=False, **kw)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps=eps, param_dtype=param_dtype, names=("head_dim",))
            self.k_norm = RMSNorm(head_dim, eps=eps, param_dtype=param_dtype, names=("head_dim",))
        else:
            self.q_norm = self.k_norm = None

    def __call__(self, x_BLD, cos_BLH, sin_BLH, visible, cache_kv=None, norm: Optional[RMSNorm] = None):
        """Attends the L queries of `norm(x_BLD)` (or `x_BLD` without `norm`) over their own keys and, with a
        cache, the S cached slots.

        With a cache the new keys are *not* written into the layer's cache slice here: the scores over the
        old slots and over the L new keys are computed separately and share one softmax,

            softmax([q·K_oldᵀ, q·K_newᵀ] / √H + mask) · [V_old; V_new],

        which is the same attention as over the updated cache (only the summation order differs), and the
        caller writes all layers' new keys into the cache with one in-place update after the layer scan.
        In decode (L = 1) this avoids copying the layer's whole `[B, K, S, H]` slice every step.

        The norm and the q/k/v projections run under one `jax.checkpoint` (`_project`): for the backward pass
        a training step keeps x, the projections' outputs q, k, v (which `attend` keeps anyway) and, with
        qk-norm, the raw q and k projections; it recomputes norm(x) (elementwise) rather than keeping the
        norm's [B, L, D] output and normalised input.

        Args:
          x_BLD: [B, L, D] input.
          cos_BLH, sin_BLH: [B, L, H] RoPE tables of the query/new-key positions.
          visible: without a cache, a causal `attention.KeyMask` (or [B, L, L] bool: which keys each query
            sees, no query seeing a later key), a `shared_prompt.GroupVisibility` (rows are [prompt | G completions]
            groups) or an `unpadded.Unpadded` (rows are the real tokens of padded rows, end to end); with a
            cache, the pair ([B, L, S] visible old slots, [B, L, L] visible new keys).
          cache_kv: None, or (k_BKSH, v_BKSH) of this layer.
          norm: None, or the pre-norm applied to `x_BLD` first.

        Returns:
          ([B, L, D] output, (k_BKLH, v_BKLH) the new keys/values after RoPE, in the cache dtype if any).
        """
        project = lambda x_BLD: self._project(x_BLD if norm is None else norm(x_BLD), cos_BLH, sin_BLH)
        q_BLKGH, k_BKLH, v_BKLH = jax.checkpoint(project, policy=_KEEP_RAW_QK)(x_BLD)
        b, l, kv, g, h = q_BLKGH.shape
        n = kv * g
        if isinstance(visible, GroupVisibility):  # [prompt | G completions] rows (`shared_prompt`)
            out_BLKGH = attend_groups(q_BLKGH, k_BKLH, v_BKLH, visible)
        elif isinstance(visible, Unpadded):  # the real tokens of padded rows, end to end (`unpadded`)
            out_BLKGH = attend_unpadded(q_BLKGH, k_BKLH, v_BKLH, visible)
        elif cache_kv is None:  # training / scoring: keeps no [.., L, L] tensor for the backward pass
            out_BLKGH = attend(q_BLKGH, k_BKLH, v_BKLH, visible, causal=True)
        else:
            k_cache, v_cache = cache_kv
            k_BKLH, v_BKLH = k_BKLH.astype(k_cache.dtype), v_BKLH.astype(v_cache.dtype)
            visible_old_BLS, visible_new_BLL = visible
            old_BKGLS = masked_scores(q_BLKGH, k_cache.astype(self.dtype), visible_old_BLS)
            new_BKGLL = masked_scores(q_BLKGH, k_BKLH.astype(self.dtype), visible_new_BLL)
            slots = old_BKGLS.shape[-1]
            probs_BKGLT = jax.nn.softmax(jnp.concatenate([old_BKGLS, new_BKGLL], axis=-1), axis=-1)
            probs_BKGLT = probs_BKGLT.astype(self.dtype)  # T = S old slots + L new keys
            out_BLKGH = (_mix(probs_BKGLT[..., :slots], v_cache.astype(self.dtype))
                         + _mix(probs_BKGLT[..., slots:], v_BKLH.astype(self.dtype)))
        return self.o_proj(out_BLKGH.reshape(b, l, n, h)), (k_BKLH, v_BKLH)

    def _project(self, u_BLD, cos_BLH, sin_BLH):
        """(q [B, L, K, G, H], k [B, K, L, H], v [B, K, L, H]) of the (normed) input, q and k after RoPE."""
        q_BLNH = self.q_proj(u_BLD)
        k_BLKH = self.k_proj(u_BLD)
        v_BLKH = self.v_proj(u_BLD)
        if self.q_norm is not None:  # their backward needs the raw projections: kept, not recomputed
            q_BLNH = self.q_norm(checkpoint_name(q_BLNH, "attn_q_raw"))
            k_BLKH = self.k_norm(checkpoint_name(k_BLKH, "attn_k_raw"))
        q_BLNH = apply_rope(q_BLNH, cos_BLH, sin_BLH)
        k_BKLH = apply_rope(k_BLKH, cos_BLH, sin_BLH).transpose(0, 2, 1, 3)
        b, l, n, h = q_BLNH.shape
        q_BLKGH = q_BLNH.reshape(b, l, self.num_kv_heads, n // self.num_kv_heads, h)
        return q_BLKGH, k_BKLH, v_BLKH.transpose(0, 2, 1, 3)


_KEEP_RAW_QK = jax.checkpoint_policies.save_only_these_names("attn_q_raw", "attn_k_raw")


def _mix(probs_BKGLS, v_BKSH) -> jax.Array:
    """Σ_s p·v → [B, L, K, G, H].

    For one query (decode) this is a broadcast multiply-reduce over S: on XLA:CPU it streams V once, where the
    equivalent batched [G, S] @ [S, H] dot per (row, head) measured ~3x slower (benchmarks/RESULTS.md).
    """
    if probs_BKGLS.shape[3] == 1:
        out_BKGH = jnp.sum(probs_BKGLS[:, :, :, 0, :, None] * v_BKSH[:, :, None], axis=-2)
        return out_BKGH[:, None]
    return jnp.einsum("BKGLS,BKSH->BLKGH", probs_BKGLS, v_BKSH)
