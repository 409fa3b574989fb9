"""Independent float64 numpy forward of a jaxrl Transformer (pre / post / siamese), for one unpadded row."""

import numpy as np


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x_LnH, positions_L, theta):
    h = x_LnH.shape[-1]
    inv_freq = theta ** (-np.arange(0, h, 2, dtype=np.float64) / h)
    angles = positions_L[:, None] * inv_freq[None, :]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None, :]
    rotated = np.concatenate([-x_LnH[..., h // 2:], x_LnH[..., : h // 2]], axis=-1)
    return x_LnH * cos + rotated * sin


def _attention(p, x_LD, cfg):
    length = x_LD.shape[0]
    proj = {}
    for name in ("q", "k", "v"):
        w = p[f"{name}_proj"]
        proj[name] = np.einsum("ld,dnh->lnh", x_LD, w["kernel"]) + (w["bias"] if "bias" in w else 0.0)
    q, k, v = proj["q"], proj["k"], proj["v"]
    if cfg.qk_norm:
        q = _rms(q, p["q_norm"]["weight"], cfg.rms_norm_eps)
        k = _rms(k, p["k_norm"]["weight"], cfg.rms_norm_eps)
    positions = np.arange(length, dtype=np.float64)
    q, k = _rope(q, positions, cfg.rope_theta), _rope(k, positions, cfg.rope_theta)
    group = cfg.num_heads // cfg.num_kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("lnh,snh->nls", q, k) / np.sqrt(cfg.head_dim)
    scores = np.where(np.tril(np.ones((length, length), bool))[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("nhd,lnh->ld", p["o_proj"]["kernel"], np.einsum("nls,snh->lnh", probs, v))


def _mlp(p, x_LD):
    gate = x_LD @ p["gate_proj"]["kernel"]
    return (gate / (1 + np.exp(-gate)) * (x_LD @ p["up_proj"]["kernel"])) @ p["down_proj"]["kernel"]


def logits(cfg, params, tokens_L):
    """Causal LM logits [L, V] (float64) of one row, from the nested parameter dict of the model."""
    params = _as_f64(params)
    eps = cfg.rms_norm_eps
    x = params["embed_tokens"]["embedding"][tokens_L]
    y = x.copy()
    for layer in range(cfg.num_layers):
        p = _layer(params["layers"], layer)
        subs = (("attn", lambda u: _attention(p["self_attn"], u, cfg)), ("mlp", lambda u: _mlp(p["mlp"], u)))
        if cfg.norm == "pre":
            x = x + subs[0][1](_rms(x, p["input_layernorm"]["weight"], eps))
            x = x + subs[1][1](_rms(x, p["post_attention_layernorm"]["weight"], eps))
        elif cfg.norm == "post":
            x = _rms(x + subs[0][1](x), p["post_attention_layernorm"]["weight"], eps)
            x = _rms(x + subs[1][1](x), p["post_feedforward_layernorm"]["weight"], eps)
        else:
            c = np.sqrt(2.0 * (layer + 1))
            for name, fn in subs:
                norms = p["siamese"]
                x_bar = _rms(x, norms[f"{name}_post_norm"]["weight"], eps)
                z = fn(_rms(x_bar + _rms(y, norms[f"{name}_pre_norm"]["weight"], eps),
                            norms[f"{name}_in_norm"]["weight"], eps))
                x, y = x_bar + z / c, y + z
    if cfg.norm == "siamese":
        h = _rms(_rms(x, params["norm_x"]["weight"], eps) + _rms(y, params["norm_y"]["weight"], eps),
                 params["norm"]["weight"], eps)
    else:
        h = _rms(x, params["norm"]["weight"], eps)
    head = params["embed_tokens"]["embedding"].T if cfg.tie_embeddings else params["lm_head"]["kernel"]
    return h @ head


def _layer(tree, i):
    return {k: _layer(v, i) for k, v in tree.items()} if isinstance(tree, dict) else tree[i]


def _as_f64(tree):
    if isinstance(tree, dict):
        return {k: _as_f64(v) for k, v in tree.items()}
    return np.asarray(tree, np.float64)
