"""Upcycling: a SiameseNorm model built from a pre-norm (Llama / Qwen2 / Qwen3) model, same logits at step 0.

Li et al., "SiameseNorm: Breaking the Barrier to Reconciling Pre/Post-Norm", arXiv:2602.08064 — the paper and
its code start from scratch; this construction is ours (spec algorithms-2.md §7). Source block:
`y ← y + Attn(N_g1(y)); y ← y + MLP(N_g2(y))`, logits `N_gf(y_L) W_head`, with `N_g(v) = g ⊙ n_ε(v)`,
`n_ε(v) = v / √(ms(v) + ε)`, `ms(v) = mean(v²)`.

Construction: copy the embedding, every attention / MLP weight (Qwen3 `q_norm`/`k_norm` and Qwen2 biases
included: they live inside the sub-layers) and the head; keep `rms_norm_eps` and all other switches; set

    norm="siamese" (post-pre)                       norm="siamese_hybrid" (hybrid-pre)
    attn_post_norm = 0, attn_pre_norm = 1,          attn_norm = 0, attn_y_norm = g1
    attn_in_norm = g1
    mlp_post_norm = 0, mlp_pre_norm = 1,            mlp_norm = 0, mlp_y_norm = 1, mlp_in_norm = g2
    mlp_in_norm = g2
    norm_x = 0, norm_y = 1, norm = gf               norm_x = 0, norm_y = 1, norm = gf

Why it reproduces the source: every read of the post stream x goes through a norm of weight 0, which outputs
exactly 0 for any finite x (whatever ε), so x never reaches a sub-layer or the head, and y, which starts at
the embedding and receives every sub-layer output unscaled, *is* the source's residual stream — provided each
sub-layer sees the source's input. Hybrid-pre's attention input is `0 + N_g1(y)`: exactly the source's. The
inputs wrapped in a second norm (post-pre: both sub-layers; hybrid-pre: the MLP; both: the head) are
`N_g(n_ε(y))` instead of `N_g(y)`. Since `ms(n_ε(y)) = m / (m + ε)` with `m = ms(y)`,

    N_g(n_ε(y)) = κ_ε(m) · N_g(y),   κ_ε(m) = √((m + ε) / (m + ε(m + ε))) = 1 + ε(1 − m) / (2m) + O(ε²/m²),

a per-token scalar that is exactly 1 when ε = 0 (n_0 is scale-invariant) and ≈ 1 + ε/(2m) otherwise. So the
upcycled logits equal the source's exactly in the ε → 0 limit, and with the checkpoint's ε they differ by
these 2L + 1 (post-pre) or L + 1 (hybrid-pre) factors. They matter only where ms(y) is small: a residual
stream of rms 1 gives κ − 1 ≈ 5e-7 at ε = 1e-6, but HF-style N(0, 0.02²) embeddings (m ≈ 4e-4) give
1.2e-3 — hybrid-pre avoids the worst one, the first attention reading the raw embedding.

Why no exact construction for ε > 0 (post-pre; spec §7): at the first sub-layer x = y = e, an embedding row,
and the input is `N_in(a ⊙ e / √(ms(e) + ε))` with `a = g_post + g_pre`; matching `g ⊙ e / √(ms(e) + ε)` for
every row is one equation per vocabulary row in D unknowns, with no solution but a = 0 for a generic table of
more than D rows. An RMSNorm with ε > 0 is never the identity, so no choice of gains removes a double norm.

Training moves away from the source: the zeroed weights get gradients (`∂L/∂g_post = Σ (J_N_inᵀ ∂L/∂u) ⊙
n_ε(x)`, x being the embedding, then z/c_l: never 0), so the first optimiser step makes x̄ enter every merge;
∂L/∂x is exactly 0 at the upcycled point. Exclude norm weights from weight decay, or decay pulls them back
to 0. Hybrid-pre from a Llama / Qwen2 source keeps `qk_norm=False`: adding a per-head QK-norm (HybridNorm)
would change the function, and a norm cannot be made the identity.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jaxrl.models.config import SIAMESE_NORMS, TransformerConfig
from jaxrl.models.transformer import Transformer

UPCYCLE_NORMS = SIAMESE_NORMS


def upcycle_params(cfg: TransformerConfig, params: dict,
                   norm: str = "siamese") -> tuple[TransformerConfig, dict]:
    """The config and nested parameter dict of the SiameseNorm model (see the module docstring).

    Args:
      cfg: the pre-norm source config (`cfg.norm == "pre"`).
      params: its nested parameter dict (`nnx.state(model, nnx.Param).to_pure_dict()` layout): per-layer
        norms `layers/{input_layernorm,post_attention_layernorm}/weight` [Y, D], `norm/weight` [D].
      norm: "siamese" (post-pre) or "siamese_hybrid" (hybrid-pre).

    Returns:
      (cfg with `norm` replaced, params of that config). Arrays are shared with `params` where copied.

    Raises:
      ValueError: `cfg` is not pre-norm, or `norm` is not a SiameseNorm variant.
    """
    if norm not in UPCYCLE_NORMS:
        raise ValueError(f"upcycle norm={norm!r}; allowed: {UPCYCLE_NORMS}")
    if cfg.norm != "pre":
        raise ValueError(f"only a pre-norm model can be upcycled to SiameseNorm; this one has "
                         f"norm={cfg.norm!r}")
    layers = dict(params["layers"])
    g1 = layers.pop("input_layernorm")["weight"]
    g2 = layers.pop("post_attention_layernorm")["weight"]
    zeros, ones = jnp.zeros_like(g1), jnp.ones_like(g1)
    if norm == "siamese":
        norms = {"attn_post_norm": zeros, "attn_pre_norm": ones, "attn_in_norm": g1,
                 "mlp_post_norm": zeros, "mlp_pre_norm": ones, "mlp_in_norm": g2}
    else:
        norms = {"attn_norm": zeros, "attn_y_norm": g1, "mlp_norm": zeros, "mlp_y_norm": ones,
                 "mlp_in_norm": g2}
    layers["siamese"] = {name: {"weight": weight} for name, weight in norms.items()}
    gf = params["norm"]["weight"]
    out = dict(params, layers=layers, norm_x={"weight": jnp.zeros_like(gf)},
               norm_y={"weight": jnp.ones_like(gf)})
    return cfg.replace(norm=norm), out


def siamese_from_prenorm(model: Transformer, norm: str = "siamese") -> Transformer:
    """A SiameseNorm `Transformer` whose logits equal the pre-norm `model`'s at step 0 (up to κ; module doc).

    Args:
      model: a pre-norm `Transformer` (e.g. loaded with `jaxrl.io.hf.from_pretrained`).
      norm: "siamese" (post-pre) or "siamese_hybrid" (hybrid-pre).

    Returns:
      A new model (same `constrain`, dtypes, execution switches); `model` is left unchanged.
    """
    cfg, params = upcycle_params(model.cfg, nnx.state(model, nnx.Param).to_pure_dict(), norm)
    return Transformer.from_params(cfg, params, constrain=model.constrain)


def double_norm_factor(ms: float, eps: float) -> float:
    """κ_ε(m) = √((m + ε) / (m + ε(m + ε))): n_ε(n_ε(v)) = κ_ε(ms(v)) · n_ε(v) (module docstring)."""
    return ((ms + eps) / (ms + eps * (ms + eps))) ** 0.5
