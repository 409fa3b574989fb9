"""SiameseNorm two-stream residual wiring ("post-pre" variant), reusing `layers.RMSNorm`.

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
