"""SiameseNorm two-stream residual wiring ("post-pre" and "hybrid-pre" variants), reusing `layers.RMSNorm`.

Li et al., "SiameseNorm: Breaking the Barrier to Reconciling Pre/Post-Norm", arXiv:2602.08064. For block l and
each sub-layer F ∈ (attention, MLP), with c_l = √(2(l+1)):

    x̄ = N_post(x);   u = N_in(x̄ + N_pre(y));   z = F(u);   x ← x̄ + z / c_l;   y ← y + z
    output: h = N(N_x(x) + N_y(y))

x is the post-norm-like stream (re-normalised at every sub-layer entry), y the pre-norm-like stream (clean
identity path); both start as the token embedding. The sub-layer runs once and its output feeds both streams.

Deviations from the reference (DeiT/DiT files of Qwen-Applications/SiameseNorm):
* RMSNorm (with weight, no bias) in place of LayerNorm, as the spec asks for LLMs; the wiring functions take
  the norms as callables, so the LayerNorm worked example of the spec can be checked exactly.
* No drop-path / adaLN gates.

"hybrid-pre" (`norm="siamese_hybrid"`; the only LLM block of the reference repository,
`OLMo_model_hybrid_pre.py`, `OLMoSequentialBlock.forward`; spec algorithms-2.md §6), same streams and c_l:

    attention:  h = N_a(x) + N_ay(y);   a = Attn(h);               x ← x + a / c_l;   y ← y + a
    FFN:        x̃ = N_f(x);   m = MLP(N_fin(x̃ + N_fy(y)));      x ← x̃ + m / c_l;   y ← y + m
    output:     h = N(N_x(x) + N_y(y))

with the attention's per-head QK-norm given by the model's `qk_norm` (HybridNorm, arXiv:2503.04598, wants it
on). Reference flags implemented: `attn_norm=True`, `ffn_norm=True`, `ffn_residual_after_norm=True`; not
implemented: the `attn_norm=False` path (h = c1 ⊙ x + N_ay(y)), V-norm and context norm, `clip_qkv`,
per-layer overrides (`norm_pos_special_config`). Those flag values are a reading: the reference's configs
(`changes.patch`) are absent from its snapshot.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.models.layers import RMSNorm

Norm = Callable[[jax.Array], jax.Array]


def depth_scale(layer: jax.Array | int) -> jax.Array:
    """c_l = √(2(l+1)) for block index l (0-based); the same for both sub-layers of a block."""
    return jnp.sqrt(2.0 * (jnp.asarray(layer, jnp.float32) + 1.0))


def siamese_sublayer(x: jax.Array, y: jax.Array, sublayer: Callable[[jax.Array], jax.Array], *,
                     post_norm: Norm, pre_norm: Norm, in_norm: Norm,
                     scale: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One sub-layer of the wiring: returns the new (x, y) streams (see the module docstring)."""
    x_bar = post_norm(x)
    z = sublayer(in_norm(x_bar + pre_norm(y)))
    return x_bar + z / scale.astype(z.dtype), y + z


def siamese_merge(x: jax.Array, y: jax.Array, *, norm_x: Norm, norm_y: Norm, norm: Norm) -> jax.Array:
    """h = N(N_x(x) + N_y(y)): the final hidden state that feeds the LM head."""
    return norm(norm_x(x) + norm_y(y))


class SiameseNorms(nnx.Module):
    """The six per-block norms: `{attn,mlp}_{post,pre,in}_norm` (HF names `siamese.<name>.weight`)."""

    def __init__(self, dim: int, *, eps: float, param_dtype=jnp.float32):
        for sub in ("attn", "mlp"):
            for role in ("post", "pre", "in"):
                setattr(self, f"{sub}_{role}_norm", RMSNorm(dim, eps=eps, param_dtype=param_dtype))

    def apply(self, sub: str, x, y, sublayer, scale):
        """Runs `siamese_sublayer` with the norms of sub-layer `sub` ("attn" or "mlp")."""
        return siamese_sublayer(
            x, y, sublayer, post_norm=getattr(self, f"{sub}_post_norm"),
            pre_norm=getattr(self, f"{sub}_pre_norm"), in_norm=getattr(self, f"{sub}_in_norm"), scale=scale,
        )


# ------------------------------------------------------------------------------------ "hybrid-pre" variant

def hybrid_attention(x: jax.Array, y: jax.Array, attention: Callable[[jax.Array], jax.Array], *,
                     attn_norm: Norm, attn_y_norm: Norm, scale: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Attention sub-layer of the "hybrid-pre" block (`OLMo_model_hybrid_pre.py`, `attn_norm=True` path).

        h = N_a(x) + N_ay(y);   a = Attn(h);   x ← x + a / c_l;   y ← y + a

    No input norm on the merge (rms(h) lies in [0, 2]) and x is not re-normalised before its residual; the
    attention's own QK-norm (per head, before RoPE) is the model's `qk_norm`.
    """
    a = attention(attn_norm(x) + attn_y_norm(y))
    return x + a / scale.astype(a.dtype), y + a


def hybrid_mlp(x: jax.Array, y: jax.Array, mlp: Callable[[jax.Array], jax.Array], *, mlp_norm: Norm,
               mlp_y_norm: Norm, mlp_in_norm: Norm, scale: jax.Array) -> tuple[jax.Array, jax.Array]:
    """FFN sub-layer of the "hybrid-pre" block: post-norm on x, residual after the norm.

        x̃ = N_f(x);   m = MLP(N_fin(x̃ + N_fy(y)));   x ← x̃ + m / c_l;   y ← y + m

    (reference flags `ffn_norm=True`, `ffn_residual_after_norm=True`).
    """
    x_tilde = mlp_norm(x)
    m = mlp(mlp_in_norm(x_tilde + mlp_y_norm(y)))
    return x_tilde + m / scale.astype(m.dtype), y + m


HYBRID_NORM_NAMES = ("attn_norm", "attn_y_norm", "mlp_norm", "mlp_y_norm", "mlp_in_norm")


class HybridNorms(nnx.Module):
    """The five per-block norms of "hybrid-pre" (HF names `siamese.<name>.weight`, `HYBRID_NORM_NAMES`).

    Reference names: `attn_norm` (N_a), `attn_y_norm` (N_ay), `ff_norm` (N_f), `ff_y_norm` (N_fy),
    `ff_input_norm` (N_fin); the output norms (`ln_f`, `ln_y_f`, `ln_final_f`) are the model's `norm_x`,
    `norm_y`, `norm`, as for "post-pre".
    """

    def __init__(self, dim: int, *, eps: float, param_dtype=jnp.float32):
        for name in HYBRID_NORM_NAMES:
            setattr(self, name, RMSNorm(dim, eps=eps, param_dtype=param_dtype))

    def attention(self, x, y, attention, scale):
        return hybrid_attention(x, y, attention, attn_norm=self.attn_norm, attn_y_norm=self.attn_y_norm,
                                scale=scale)

    def mlp(self, x, y, mlp, scale):
        return hybrid_mlp(x, y, mlp, mlp_norm=self.mlp_norm, mlp_y_norm=self.mlp_y_norm,
                          mlp_in_norm=self.mlp_in_norm, scale=scale)
