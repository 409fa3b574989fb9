"""Upcycling a pre-norm model into SiameseNorm (`jaxrl.models.upcycle`): same logits at step 0, trainable.

Exactness holds in the ε → 0 limit; with ε > 0 each doubly-normalised input is scaled by
κ_ε(m) = √((m+ε)/(m+ε(m+ε))) (module docstring), which these tests measure rather than hide.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig, set_params
from jaxrl.models.upcycle import double_norm_factor, siamese_from_prenorm, upcycle_params

TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)), jnp.int32)
FAMILIES = {
    "llama": dict(),
    "qwen2": dict(family="qwen2", qkv_bias=True),
    "qwen3": dict(family="qwen3", qk_norm=True, tie_embeddings=True),
}
VARIANTS = ("siamese", "siamese_hybrid")


def _source(family, eps, seed=0, embed_std=None):
    """A random pre-norm model: HF-style init, every norm weight 1 ± 0.2 (so a misplaced gain shows)."""
    cfg = TransformerConfig.tiny(rms_norm_eps=eps, **FAMILIES[family])
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)

    def draw(path, a):
        key = jax.tree_util.keystr(path)
        if "norm" in key:
            return (1.0 + 0.2 * rng.standard_normal(a.shape)).astype(np.float32)
        if "bias" in key:
            return (0.05 * rng.standard_normal(a.shape)).astype(np.float32)
        if "embedding" in key and embed_std is not None:
            return (embed_std * rng.standard_normal(a.shape)).astype(np.float32)
        return np.asarray(a)

    set_params(model, jax.tree_util.tree_map_with_path(draw, nnx.state(model, nnx.Param).to_pure_dict()))
    return model


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_equal_in_the_eps_to_zero_limit(family, variant):
    """ε = 1e-12 ≪ ms(residual) ≈ 4e-4: κ − 1 ≈ 1e-9, below float32 resolution, so the match must be exact."""
    source = _source(family, eps=1e-12)
    upcycled = siamese_from_prenorm(source, variant)
    assert upcycled.cfg.norm == variant and source.cfg.norm == "pre"
    assert upcycled.cfg.replace(norm="pre") == source.cfg
    want = np.asarray(source(TOKENS))
    assert np.max(np.abs(want)) > 0.1
    np.testing.assert_allclose(np.asarray(upcycled(TOKENS)), want, atol=1e-6, rtol=0)
    # Sensitivity: the same construction with g1/g2 swapped is visibly wrong.
    cfg, params = upcycle_params(source.cfg, nnx.state(source, nnx.Param).to_pure_dict(), variant)
    names = {"siamese": ("attn_in_norm", "mlp_in_norm"), "siamese_hybrid": ("attn_y_norm", "mlp_in_norm")}
    a, b = names[variant]
    norms = params["layers"]["siamese"]
    norms[a], norms[b] = norms[b], norms[a]
    swapped = np.asarray(Transformer.from_params(cfg, params)(TOKENS))
    assert np.max(np.abs(swapped - want)) > 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_checkpoint_eps_error_is_the_double_norm_factor(family, variant):
    """ε = 1e-6 and HF-scale embeddings (std 0.02): the gap is the κ factors, ≈ ε/(2m) relative, not 0.

    Post-pre has 2L + 1 doubly-normalised inputs, hybrid-pre L + 1; with m_min the smallest ms(embedding row)
    each factor is at most κ(m_min) (the residual stream grows at this init), bounding the relative gap.
    """
    eps = 1e-6
    source = _source(family, eps=eps)
    want = np.asarray(source(TOKENS))
    got = np.asarray(siamese_from_prenorm(source, variant)(TOKENS))
    rows = np.asarray(source.embed_tokens.embedding[...])[np.asarray(TOKENS)]
    kappa = double_norm_factor(float(np.min(np.mean(rows.astype(np.float64) ** 2, -1))), eps) - 1
    layers = source.cfg.num_layers
    places = 2 * layers + 1 if variant == "siamese" else layers + 1
    gap = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert 0.1 * kappa < gap < places * kappa, (gap, kappa)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_equal_at_unit_residual_scale(family, variant):
    """With a residual stream of rms ≈ 1 (embedding std 1), κ − 1 ≈ ε(1 − m)/(2m) ≈ 0: equal at ε = 1e-6.

    Tied heads then give logits up to ~40, so the 1e-5 tolerance is relative to the largest |logit|.
    """
    source = _source(family, eps=1e-6, embed_std=1.0)
    want = np.asarray(source(TOKENS))
    scale = np.max(np.abs(want))
    got = np.asarray(siamese_from_prenorm(source, variant)(TOKENS))
    np.testing.assert_allclose(got / scale, want / scale, atol=1e-5, rtol=0)


def test_double_norm_factor_matches_a_double_rms_norm():
    v = np.random.default_rng(1).normal(0, 0.03, 16)
    n = lambda u, eps: u / np.sqrt(np.mean(u * u) + eps)  # noqa: E731
    for eps in (1e-6, 1e-5):
        np.testing.assert_allclose(n(n(v, eps), eps), double_norm_factor(np.mean(v * v), eps) * n(v, eps),
                                   rtol=1e-12)
    assert double_norm_factor(1 - 1e-6, 1e-6) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_adam_step_moves_the_post_stream_gains(variant):
    """At the upcycled point the zeroed x-stream gains have non-zero gradients; one step makes x matter."""
    model = siamese_from_prenorm(_source("qwen3", eps=1e-6), variant)
    before = np.asarray(model(TOKENS))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss_fn(p):
        logits = nnx.merge(graphdef, p)(TOKENS[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, TOKENS[:, 1:]).mean()

    grads = jax.grad(loss_fn)(params).to_pure_dict()
    zeroed = ["attn_post_norm", "mlp_post_norm"] if variant == "siamese" else ["attn_norm", "mlp_norm"]
    for name in zeroed:
        start = params.to_pure_dict()["layers"]["siamese"][name]["weight"]
        np.testing.assert_array_equal(np.asarray(start), 0)
        assert np.all(np.linalg.norm(np.asarray(grads["layers"]["siamese"][name]["weight"]), axis=-1) > 1e-6)
    assert np.linalg.norm(np.asarray(grads["norm_x"]["weight"])) > 1e-6

    lr = 1e-2
    opt = optax.adam(lr)
    updates, _ = opt.update(jax.grad(loss_fn)(params), opt.init(params), params)
    stepped = nnx.merge(graphdef, optax.apply_updates(params, updates))
    moved = nnx.state(stepped, nnx.Param).to_pure_dict()
    for name in zeroed:  # Adam's first step is ≈ lr · sign(grad) per coordinate
        w = np.asarray(moved["layers"]["siamese"][name]["weight"])
        assert np.median(np.abs(w)) == pytest.approx(lr, rel=0.05)
    after = np.asarray(stepped(TOKENS))
    assert np.max(np.abs(after - before)) > 1e-3
    assert loss_fn(nnx.state(stepped, nnx.Param)) < loss_fn(params)


def test_rejects_a_non_prenorm_source_and_unknown_variant():
    model = Transformer(TransformerConfig.tiny(norm="post"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="only a pre-norm model"):
        siamese_from_prenorm(model, "siamese")
    with pytest.raises(ValueError, match="allowed"):
        siamese_from_prenorm(_source("llama", 1e-6), "post")


def test_model_upcycle_config_applies_to_an_hf_directory(tmp_path):
    """`model.upcycle` in a config: build_model loads the pre-norm HF directory and upcycles it."""
    from jaxrl.io import hf
    from jaxrl.io.build import build_model
    from jaxrl.config import ModelConfig

    source = _source("qwen3", eps=1e-12)
    hf.save_pretrained(source, tmp_path / "src")
    cfg = ModelConfig(preset=None, hf_path=str(tmp_path / "src"), upcycle="siamese_hybrid", scan_layers=False)
    model = build_model(cfg, vocab_size=64, seed=0)
    assert model.cfg.norm == "siamese_hybrid" and not model.cfg.scan_layers and model.cfg.qk_norm
    np.testing.assert_allclose(np.asarray(model(TOKENS)), np.asarray(source(TOKENS)), atol=1e-6, rtol=0)


def test_model_upcycle_config_errors(tmp_path):
    from jaxrl.io import hf
    from jaxrl.io.build import build_model
    from jaxrl.config import ModelConfig
    from jaxrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.upcycle='post': allowed values are 'siamese', 'siamese_h"):
        ModelConfig(preset=None, hf_path=str(tmp_path), upcycle="post")
    with pytest.raises(ConfigError, match="model.upcycle='siamese': needs pre-norm weights"):
        ModelConfig(upcycle="siamese")  # the default preset
    hf.save_pretrained(Transformer(TransformerConfig.tiny(norm="post"), rngs=nnx.Rngs(0)), tmp_path / "post")
    with pytest.raises(ConfigError, match="has norm='post'; only a pre-norm model can be upcycled"):
        build_model(ModelConfig(preset=None, hf_path=str(tmp_path / "post"), upcycle="siamese"),
                    vocab_size=64, seed=0)
