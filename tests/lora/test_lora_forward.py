"""Unmerged LoRA forward (`attach`): the same logits as the merged model on every norm placement, scanned and
unrolled layers, with a KV cache, and on a quantised base; greedy sampling gives the merged model's tokens.

Compiling is this file's time, so the forwards a test compares run in one jitted program (the three configs
of the first test share two: before and after attaching) and both gradients in another.
"""

import functools

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
CFGS = [
    TransformerConfig.tiny(family="qwen2", qkv_bias=True),
    TransformerConfig.tiny(family="qwen3", qk_norm=True, norm="post", scan_layers=False),
    TransformerConfig.tiny(norm="siamese", remat="full"),
]
_logits = nnx.jit(lambda models, tokens: [model(tokens) for model in models])  # one program per model tuple


def _setup(cfg):
    """(model, its params, adapters): HF-style random weights (kernels and embeddings N(0, 0.02²), norms 1,
    biases 0, as `Transformer`'s own init) and adapters of `lora.init_adapters`' layout, A and B N(0, 0.2²)
    (B ≠ 0, so that they change the logits). Drawn in numpy: run eagerly, JAX's init compiled each random
    draw on its own, several seconds a config."""
    rng = np.random.default_rng(0)

    def draw(path, leaf):
        key = jax.tree_util.keystr(path)
        if "norm" in key or "bias" in key:
            return np.full(leaf.shape, 1.0 if "norm" in key else 0.0, np.float32)
        return (0.02 * rng.standard_normal(leaf.shape)).astype(np.float32)

    abstract = nnx.state(Transformer.abstract(cfg), nnx.Param).to_pure_dict()
    model = Transformer.from_params(cfg, jax.tree_util.tree_map_with_path(draw, abstract))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    layout = jax.eval_shape(lambda p: lora.init_adapters(p, LCFG, jax.random.key(1)), params)
    ad = jax.tree.map(lambda x: jnp.asarray(0.2 * rng.standard_normal(x.shape), jnp.float32), layout)
    return model, params, ad


@functools.cache
def _attached_and_merged():
    """{cfg: (base model, attached model, base logits before attaching, attached and merged logits, base logits
    after attaching)} for every config of CFGS. One jitted program runs the base models, before attaching and
    again after (the same program: equal bits unless attaching changed them); another the others."""
    setups = [_setup(cfg) for cfg in CFGS]
    bases = [model for model, _, _ in setups]
    before = _logits(bases, TOKENS)
    attached = [attach(model, ad, LCFG) for model, _, ad in setups]
    merged = [Transformer.from_params(cfg, lora.merge(params, ad, LCFG)) for cfg, (_, params, ad) in zip(CFGS, setups)]
    after = _logits([*attached, *merged], TOKENS)
    base_after = _logits(bases, TOKENS)
    n = len(CFGS)
    return {cfg: (bases[i], attached[i], *map(np.asarray, (before[i], after[i], after[n + i], base_after[i])))
            for i, cfg in enumerate(CFGS)}


@pytest.mark.parametrize("cfg", CFGS)
def test_attached_equals_merged_and_leaves_base_alone(cfg):
    model, attached, base_logits, got, merged, base_after = _attached_and_merged()[cfg]
    assert isinstance(attached.layers.self_attn.q_proj, LoraProj)
    assert not isinstance(model.layers.self_attn.q_proj, LoraProj)  # the base model is untouched
    assert np.abs(merged - base_logits).max() > 0.05
    np.testing.assert_allclose(got, merged, atol=2e-6, rtol=0)
    np.testing.assert_array_equal(base_after, base_logits)


def test_attached_with_cache_and_quantised_base():
    cfg = TransformerConfig.tiny()
    model, params, ad = _setup(cfg)
    @jax.jit
    def quantize_and_merge(params, ad):  # one program (eagerly, each kernel's dequantisation compiled its own)
        qp = quant.quantize_params(params, "nf4", block=32)
        return qp, lora.merge(qp, ad, LCFG)

    qp, merged_params = quantize_and_merge(params, ad)
    attached = attach(model, ad, LCFG, quantized=qp)
    assert isinstance(attached.layers.mlp.gate_proj, LoraProj)  # non-target: runs from its codes too
    assert attached.layers.mlp.gate_proj.lora_a is None
    merged = Transformer.from_params(cfg, merged_params)

    @nnx.jit
    def three_ways(attached, merged):  # one program: merged, attached, attached with a KV cache
        cache = KVCache.init(cfg, 2, 16)  # prefill 5 tokens, then 3 one at a time
        out = attached.forward(TOKENS[:, :5], cache=cache)
        logits = [out.logits]
        for t in range(5, 8):
            out = attached.forward(TOKENS[:, t:t + 1], cache=out.cache, layers=attached.layer_states())
            logits.append(out.logits)
        return merged(TOKENS), attached(TOKENS), jnp.concatenate(logits, axis=1)

    want, got, cached = map(np.asarray, three_ways(attached, merged))
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
    np.testing.assert_allclose(cached, want, atol=2e-6, rtol=0)


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
    g_attached, g_merged = jax.jit(lambda a: (jax.grad(lambda a: loss(attach(model, a, LCFG)(TOKENS)))(a),
                                              jax.grad(lambda a: loss(merged(a)(TOKENS)))(a)))(ad)  # one program
    for x, y in zip(jax.tree.leaves(g_attached), jax.tree.leaves(g_merged)):
        assert float(jnp.abs(y).max()) > 1e-4
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=1e-7)
