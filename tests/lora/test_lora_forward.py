"""Unmerged LoRA forward (`attach`): the same logits as the merged model on every norm placement, scanned and
unrolled layers, with a KV cache, and on a quantised base; greedy sampling gives the merged model's tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import KVCache, Transformer, TransformerConfig, lora, quant
from jaxrl.models.lora_forward import LoraProj, attach
from jaxrl.sampling import generate

TOKENS = jnp.asarray(np.random.default_rng(2).integers(3, 64, (2, 8)), jnp.int32)
LCFG = lora.LoraConfig(rank=3, alpha=6.0, targets=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj"))
_logits = nnx.jit(lambda model, tokens: model(tokens))  # compiled once per model structure and config


def _setup(cfg):
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    ad = lora.init_adapters(params, LCFG, jax.random.key(1))
    keys = iter(jax.random.split(jax.random.key(2), 16))
    ad = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), ad)
    return model, params, ad


@pytest.mark.parametrize("cfg", [
    TransformerConfig.tiny(family="qwen2", qkv_bias=True),
    TransformerConfig.tiny(family="qwen3", qk_norm=True, norm="post", scan_layers=False),
    TransformerConfig.tiny(norm="siamese", remat="full"),
])
def test_attached_equals_merged_and_leaves_base_alone(cfg):
    model, params, ad = _setup(cfg)
    base_logits = np.asarray(_logits(model, TOKENS))
    attached = attach(model, ad, LCFG)
    assert isinstance(attached.layers.self_attn.q_proj, LoraProj)
    assert not isinstance(model.layers.self_attn.q_proj, LoraProj)  # the base model is untouched
    merged = np.asarray(_logits(Transformer.from_params(cfg, lora.merge(params, ad, LCFG)), TOKENS))
    got = np.asarray(_logits(attached, TOKENS))
    assert np.abs(merged - base_logits).max() > 0.05
    np.testing.assert_allclose(got, merged, atol=2e-6, rtol=0)
    np.testing.assert_array_equal(np.asarray(_logits(model, TOKENS)), base_logits)


def test_attached_with_cache_and_quantised_base():
    cfg = TransformerConfig.tiny()
    model, params, ad = _setup(cfg)
    qp = quant.quantize_params(params, "nf4", block=32)
    attached = attach(model, ad, LCFG, quantized=qp)
    assert isinstance(attached.layers.mlp.gate_proj, LoraProj)  # non-target: runs from its codes too
    assert attached.layers.mlp.gate_proj.lora_a is None
    merged = Transformer.from_params(cfg, lora.merge(qp, ad, LCFG))
    want = np.asarray(_logits(merged, TOKENS))
    np.testing.assert_allclose(np.asarray(_logits(attached, TOKENS)), want, atol=2e-6, rtol=0)

    @nnx.jit
    def cached_logits(attached):
        cache = KVCache.init(cfg, 2, 16)  # prefill 5 tokens, then 3 one at a time
        out = attached.forward(TOKENS[:, :5], cache=cache)
        logits = [out.logits]
        for t in range(5, 8):
            out = attached.forward(TOKENS[:, t:t + 1], cache=out.cache, layers=attached.layer_states())
            logits.append(out.logits)
        return jnp.concatenate(logits, axis=1)

    np.testing.assert_allclose(np.asarray(cached_logits(attached)), want, atol=2e-6, rtol=0)


def test_greedy_generation_matches_merged_model():
    cfg = TransformerConfig.tiny(family="qwen3", qk_norm=True)
    model, params, ad = _setup(cfg)
    merged = Transformer.from_params(cfg, lora.merge(params, ad, LCFG))
    prompts = [[3, 4, 5, 6], [7, 8]]
    a = generate(merged, prompts, max_new_tokens=6, temperature=0.0)
    b = generate(attach(model, ad, LCFG), prompts, max_new_tokens=6, temperature=0.0)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-6)


def test_gradients_through_attached_equal_gradients_through_merge():
    """Training may use the unmerged form (no W + ΔW rounding in bfloat16): same adapter gradients."""
    cfg = TransformerConfig.tiny(family="qwen2", qkv_bias=True)
    model, params, ad = _setup(cfg)

    def loss(logits):
        return jnp.mean(jax.nn.log_softmax(logits)[..., 5] * jnp.arange(8.0)[None, :])

    merged = lambda a: Transformer.from_params(cfg, lora.merge(params, a, LCFG))
    g_attached = jax.jit(jax.grad(lambda a: loss(attach(model, a, LCFG)(TOKENS))))(ad)
    g_merged = jax.jit(jax.grad(lambda a: loss(merged(a)(TOKENS))))(ad)
    for x, y in zip(jax.tree.leaves(g_attached), jax.tree.leaves(g_merged)):
        assert float(jnp.abs(y).max()) > 1e-4
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=1e-7)
