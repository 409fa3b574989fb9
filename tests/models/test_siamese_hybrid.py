"""SiameseNorm "hybrid-pre" (`norm="siamese_hybrid"`): spec worked example, float64 numpy reference, KV cache.

The reference below is written from the block's equations (spec algorithms-2.md §6, Li et al.
arXiv:2602.08064, `OLMo_model_hybrid_pre.py`), not from `models/siamese.py`:

    h = N_a(x) + N_ay(y);  a = Attn(h);  x ← x + a/c_l;  y ← y + a
    x̃ = N_f(x);  m = MLP(N_fin(x̃ + N_fy(y)));  x ← x̃ + m/c_l;  y ← y + m;   c_l = √(2(l+1))
    logits = N(N_x(x_L) + N_y(y_L)) W_head
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import KVCache, Transformer, TransformerConfig, set_params
from jaxrl.models.siamese import depth_scale, hybrid_attention, hybrid_mlp, siamese_merge
import _numpy_ref  # sibling helper module: float64 attention / MLP / RMSNorm


def _rms_plain(v):
    """RMSNorm without weight, ε = 1e-6 (the spec's worked example)."""
    return v / jnp.sqrt(jnp.mean(v * v, -1, keepdims=True) + 1e-6)


def test_spec_worked_example_attn_norm_path():
    """algorithms-2.md §6 example: F_A(u) = [0.5, −0.5, 0.25, 1] ⊙ u, F_M = tanh, block l = 0."""
    x = y = jnp.array([1.0, 2.0, 3.0, 4.0])
    scale = depth_scale(0)
    seen = []

    def f_attn(h):
        seen.append(h)
        return jnp.array([0.5, -0.5, 0.25, 1.0]) * h

    x, y = hybrid_attention(x, y, f_attn, attn_norm=_rms_plain, attn_y_norm=_rms_plain, scale=scale)
    np.testing.assert_allclose(seen[0], [0.7303, 1.4606, 2.1909, 2.9212], atol=1e-4)  # rms 2: not re-normed
    np.testing.assert_allclose(x, [1.2582, 1.4836, 3.3873, 6.0656], atol=1e-4)
    np.testing.assert_allclose(y, [1.3651, 1.2697, 3.5477, 6.9212], atol=1e-4)
    x, y = hybrid_mlp(x, y, jnp.tanh, mlp_norm=_rms_plain, mlp_y_norm=_rms_plain, mlp_in_norm=_rms_plain,
                      scale=scale)
    np.testing.assert_allclose(x, [0.5837, 0.6582, 1.4501, 2.3435], atol=1e-4)
    np.testing.assert_allclose(y, [1.6973, 1.6189, 4.2705, 7.8575], atol=1e-4)
    h = siamese_merge(x, y, norm_x=_rms_plain, norm_y=_rms_plain, norm=_rms_plain)
    np.testing.assert_allclose(h, [0.3856, 0.4029, 0.9639, 1.6613], atol=1e-4)


def _reference_logits(cfg, params, tokens_L):
    """Float64 hybrid-pre forward of one unpadded row, from the nested parameter dict."""
    p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    eps = cfg.rms_norm_eps

    def rms(v, w):
        return v / np.sqrt(np.mean(v * v, -1, keepdims=True) + eps) * w

    x = p64["embed_tokens"]["embedding"][tokens_L]
    y = x.copy()
    for layer in range(cfg.num_layers):
        p = jax.tree.map(lambda a, i=layer: a[i], p64["layers"])
        n = {k: v["weight"] for k, v in p["siamese"].items()}
        c = np.sqrt(2.0 * (layer + 1))
        a = _numpy_ref._attention(p["self_attn"], rms(x, n["attn_norm"]) + rms(y, n["attn_y_norm"]), cfg)
        x, y = x + a / c, y + a
        x_tilde = rms(x, n["mlp_norm"])
        m = _numpy_ref._mlp(p["mlp"], rms(x_tilde + rms(y, n["mlp_y_norm"]), n["mlp_in_norm"]))
        x, y = x_tilde + m / c, y + m
    h = rms(rms(x, p64["norm_x"]["weight"]) + rms(y, p64["norm_y"]["weight"]), p64["norm"]["weight"])
    head = p64["embed_tokens"]["embedding"].T if cfg.tie_embeddings else p64["lm_head"]["kernel"]
    return h @ head


def _random_model(cfg, seed):
    """Every parameter random: each norm weight its own 1 ± 0.3 draw (a swapped norm changes the logits)."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)

    def draw(path, a):
        if "norm" in jax.tree_util.keystr(path):
            return (1.0 + 0.3 * rng.standard_normal(a.shape)).astype(np.float32)
        return (0.1 * rng.standard_normal(a.shape)).astype(np.float32)

    params = jax.tree_util.tree_map_with_path(draw, nnx.state(model, nnx.Param).to_pure_dict())
    set_params(model, params)
    return model, params


CASES = {
    "qwen3_qk_norm_untied": dict(family="qwen3", qk_norm=True, num_layers=3),
    "qwen2_bias_tied": dict(family="qwen2", qkv_bias=True, tie_embeddings=True),
    "llama_no_qk_norm": dict(),
}


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_float64_reference(case, scan):
    cfg = TransformerConfig.tiny(norm="siamese_hybrid", scan_layers=scan, **CASES[case])
    model, params = _random_model(cfg, seed=7)
    assert set(params["layers"]["siamese"]) == {"attn_norm", "attn_y_norm", "mlp_norm", "mlp_y_norm",
                                                "mlp_in_norm"}
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 9))
    ours = np.asarray(model(jnp.asarray(tokens, jnp.int32)))
    for row in range(2):
        ref = _reference_logits(cfg, params, tokens[row])
        assert np.max(np.abs(ref)) > 0.5  # non-trivial logits, so the tolerance below means something
        np.testing.assert_allclose(ours[row], ref, atol=1e-5, rtol=0)


def test_reference_sees_the_wiring():
    """Sensitivity guard: post-pre wiring on the same sub-layer weights gives clearly different logits."""
    cfg = TransformerConfig.tiny(norm="siamese_hybrid", family="qwen3", qk_norm=True)
    model, params = _random_model(cfg, seed=7)
    tokens = np.arange(9)
    hybrid = _reference_logits(cfg, params, tokens)
    post_pre = dict(params, layers=dict(params["layers"]))
    ones = np.ones_like(params["layers"]["siamese"]["attn_norm"]["weight"])
    post_pre["layers"]["siamese"] = {f"{s}_{r}_norm": {"weight": ones} for s in ("attn", "mlp")
                                     for r in ("post", "pre", "in")}
    other = _numpy_ref.logits(cfg.replace(norm="siamese"), post_pre, tokens)
    assert np.max(np.abs(other - hybrid)) > 0.1


@functools.partial(jax.jit, static_argnums=(0, 5))
def _prefill_then_decode(graphdef, state, prompt_BP, mask_BP, new_BT, per_layer, cache):
    model = nnx.merge(graphdef, state)
    out = model.forward(prompt_BP, None, mask_BP, cache=cache)
    layers = model.layer_states() if per_layer else None

    def body(t, carry):
        logits_BTV, cache = carry
        step = model.forward(new_BT[:, t][:, None], None, jnp.ones((new_BT.shape[0], 1), bool), cache=cache,
                             layers=layers)
        return logits_BTV.at[:, t].set(step.logits[:, 0]), step.cache

    init = (jnp.zeros(new_BT.shape + (model.cfg.vocab_size,), jnp.float32),
            out.cache.unstack() if per_layer else out.cache)
    logits_BTV, _ = jax.lax.fori_loop(0, new_BT.shape[1], body, init)
    return out.logits, logits_BTV


@pytest.mark.parametrize("per_layer", [False, True])
def test_kv_cache_decode_matches_full_forward(per_layer):
    prompt, new = 5, 4
    cfg = TransformerConfig.tiny(norm="siamese_hybrid", family="qwen3", qk_norm=True)
    model, _ = _random_model(cfg, seed=3)
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.vocab_size, (3, prompt + new)).astype(np.int32)
    prompt_mask = np.arange(prompt)[None] >= np.array([0, 2, 4])[:, None]  # left padding: 5, 3, 1 tokens
    tokens[:, :prompt] = np.where(prompt_mask, tokens[:, :prompt], 0)
    full_mask = np.concatenate([prompt_mask, np.ones((3, new), bool)], axis=1)
    full = np.asarray(model.forward(jnp.asarray(tokens), None, jnp.asarray(full_mask)).logits)

    graphdef, state = nnx.split(model)
    prefill, decoded = _prefill_then_decode(
        graphdef, state, jnp.asarray(tokens[:, :prompt]), jnp.asarray(prompt_mask),
        jnp.asarray(tokens[:, prompt:]), per_layer, KVCache.init(cfg, 3, prompt + new + 2, "float32"))
    np.testing.assert_allclose(np.asarray(prefill)[prompt_mask], full[:, :prompt][prompt_mask], atol=1e-5,
                               rtol=0)
    np.testing.assert_allclose(np.asarray(decoded), full[:, prompt:], atol=1e-5, rtol=0)
    assert np.max(np.abs(full)) > 0.5
