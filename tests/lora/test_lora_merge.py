"""LoRA merge: zero adapters are the base, nonzero ones equal a float64 W + s·A·B by hand, gradients reach
only the adapters (and equal s·Aᵀ·∂L/∂W at B = 0), on every family and norm placement. Logits and gradients
are jitted (one program per config: eager dispatch compiled one small program per primitive and shape); the
mismatched adapter of the last test only needs its shapes (`jax.eval_shape`)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.errors import ConfigError
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.models import lora
from tests.models import _numpy_ref  # float64 numpy forward shared with tests/models

CASES = {
    "llama_pre": TransformerConfig.tiny(),
    "qwen2_bias_tied": TransformerConfig.tiny(family="qwen2", qkv_bias=True, tie_embeddings=True),
    "qwen3_qk_norm": TransformerConfig.tiny(family="qwen3", qk_norm=True),
    "llama_post": TransformerConfig.tiny(norm="post"),
    "qwen3_siamese": TransformerConfig.tiny(family="qwen3", qk_norm=True, qkv_bias=True, norm="siamese"),
}
TOKENS = np.random.default_rng(0).integers(0, 64, (2, 7))


def _base(cfg, seed=0):
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 100), len(leaves))  # random norms and biases too
    noisy = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, noisy)


@functools.partial(jax.jit, static_argnums=0)
def _logits(cfg, params):
    return Transformer.from_params(cfg, params)(jnp.asarray(TOKENS, jnp.int32))


def _random_adapters(params, lcfg, seed):
    adapters = lora.init_adapters(params, lcfg, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 1), 32))
    return jax.tree.map(lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), adapters)


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(rank=0), "rank must be a positive int"), (dict(alpha=0.0), "alpha must be a number > 0"),
     (dict(dropout=0.05), "only 0 is supported"), (dict(targets=("q_proj", "lm_head")), "distinct names"),
     (dict(targets=()), "distinct names")])
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        lora.LoraConfig(**kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_zero_init_adapters_give_identical_logits(case):
    cfg = CASES[case]
    params = _base(cfg)
    adapters = lora.init_adapters(params, lora.LoraConfig(rank=4), jax.random.key(1))
    assert float(jnp.abs(adapters["layers"]["self_attn"]["q_proj"]["lora_a"]).max()) > 0  # A random, B zero
    merged = lora.merge(params, adapters, lora.LoraConfig(rank=4))
    np.testing.assert_array_equal(_logits(cfg, merged), _logits(cfg, params))


def _merge_f64(params, adapters, lcfg):
    """W + (α/r)·A·B in float64, written out per target with numpy."""
    out = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    for target in lcfg.targets:
        block, num_in, _ = lora.SITES[target]
        ad = adapters["layers"][block][target]
        a, b = np.asarray(ad["lora_a"], np.float64), np.asarray(ad["lora_b"], np.float64)
        w = out["layers"][block][target]["kernel"]
        for y in range(w.shape[0]):
            a2 = a[y].reshape(-1, lcfg.rank)
            b2 = b[y].reshape(lcfg.rank, -1)
            w[y] += (lcfg.alpha / lcfg.rank) * (a2 @ b2).reshape(w.shape[1:])
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_nonzero_adapters_match_float64_reference(case):
    cfg = CASES[case]
    targets = lora.TARGETS if case != "llama_post" else ("v_proj", "o_proj", "down_proj")
    lcfg = lora.LoraConfig(rank=3, alpha=5.0, targets=targets)
    params = _base(cfg)
    adapters = _random_adapters(params, lcfg, seed=2)
    ours = np.asarray(_logits(cfg, lora.merge(params, adapters, lcfg)))
    base = np.asarray(_logits(cfg, params))
    assert np.abs(ours - base).max() > 0.05  # the adapters move the logits, so the comparison below can fail
    ref_params = _merge_f64(params, adapters, lcfg)
    for row in range(TOKENS.shape[0]):
        ref = _numpy_ref.logits(cfg, ref_params, TOKENS[row])
        np.testing.assert_allclose(ours[row], ref, atol=2e-5, rtol=0)


def _loss(cfg, params):
    logits = Transformer.from_params(cfg, params)(jnp.asarray(TOKENS[:, :-1], jnp.int32))
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, jnp.asarray(TOKENS[:, 1:, None]), axis=-1))


@pytest.mark.parametrize("case", ["qwen2_bias_tied", "qwen3_siamese"])
def test_gradient_reaches_only_adapters_and_equals_chain_rule(case):
    cfg = CASES[case]
    lcfg = lora.LoraConfig(rank=2, alpha=4.0)
    params = _base(cfg)
    adapters = lora.init_adapters(params, lcfg, jax.random.key(3))  # B = 0

    def loss(base, ad):
        return _loss(cfg, lora.merge(jax.lax.stop_gradient(base), ad, lcfg))

    g_base, g_ad = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, adapters)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(g_base))
    # at B = 0: ∂L/∂A = s·(∂L/∂W)·Bᵀ = 0 and ∂L/∂B = s·Aᵀ·(∂L/∂W), with ∂L/∂W the base model's gradient
    g_w = jax.jit(jax.grad(lambda p: _loss(cfg, p)))(params)
    for target in lcfg.targets:
        block = lora.SITES[target][0]
        got = g_ad["layers"][block][target]
        assert float(jnp.abs(got["lora_a"]).max()) == 0.0
        a = np.asarray(adapters["layers"][block][target]["lora_a"], np.float64)
        gw = np.asarray(g_w["layers"][block][target]["kernel"], np.float64)
        want = np.stack([lcfg.scale * a[y].reshape(-1, 2).T @ gw[y].reshape(a[y].reshape(-1, 2).shape[0], -1)
                         for y in range(cfg.num_layers)]).reshape(got["lora_b"].shape)
        assert np.abs(want).max() > 1e-4
        np.testing.assert_allclose(np.asarray(got["lora_b"]), want, rtol=1e-4, atol=1e-6)


def test_merge_rejects_mismatched_adapter():
    cfg = TransformerConfig.tiny()
    params = _base(cfg)
    adapters = lora.init_adapters(params, lora.LoraConfig(rank=2, targets=("q_proj",)), jax.random.key(0))
    q_only = lora.LoraConfig(rank=2, targets=("q_proj",))
    other = jax.eval_shape(lambda: lora.init_adapters(_base(cfg.replace(hidden_size=16)), q_only,
                                                      jax.random.key(0)))
    with pytest.raises(ValueError, match="does not match kernel"):
        lora.merge(params, other, lora.LoraConfig(rank=2, targets=("q_proj",)))
    with pytest.raises(KeyError, match="layers/mlp/up_proj"):
        lora.merge(params, adapters, lora.LoraConfig(rank=2, targets=("q_proj", "up_proj")))
