"""Upcycling a pre-norm model into SiameseNorm (`jaxrl.models.upcycle`): same logits at step 0, trainable.

Exactness holds in the ε → 0 limit; with ε > 0 each doubly-normalised input is scaled by
κ_ε(m) = √((m+ε)/(m+ε(m+ε))) (module docstring), which these tests measure rather than hide.

Compiling, not running, is this file's time (XLA:CPU spends ~0.5 s per program whatever its size), so the
logits every test compares come from a few jitted programs, each computed once for all the tests that read
it: one per (ε, embedding scale) running the source, both upcycled variants (and at ε = 1e-12 the swapped-gain
controls) of every family, and one for both variants' Adam step. Run eagerly, every forward recompiled its
layer scan and `jax.grad` compiled each op's forward, JVP and transpose on its own.
"""

import functools

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
SWAPPED = {"siamese": ("attn_in_norm", "mlp_in_norm"), "siamese_hybrid": ("attn_y_norm", "mlp_in_norm")}
ADAM_LR = 1e-2
_forwards = nnx.jit(lambda models, tokens: [model(tokens) for model in models])  # one program per model tuple


@functools.cache
def _init_params(family, seed):
    """The HF-style random init of a tiny `family` model (its ε does not enter the init)."""
    return nnx.state(Transformer(TransformerConfig.tiny(**FAMILIES[family]), rngs=nnx.Rngs(seed)),
                     nnx.Param).to_pure_dict()


@functools.cache
def _source(family, eps, seed=0, embed_std=None):
    """A random pre-norm model: HF-style init, every norm weight 1 ± 0.2 (so a misplaced gain shows).

    Built once per argument tuple and shared by the tests, which only read it."""
    cfg = TransformerConfig.tiny(rms_norm_eps=eps, **FAMILIES[family])
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

    model = Transformer.abstract(cfg)
    set_params(model, jax.tree_util.tree_map_with_path(draw, _init_params(family, seed)))
    return model


def _swapped(source, variant):
    """The upcycling construction with g1 and g2 swapped (`SWAPPED`): a control that must come out wrong."""
    cfg, params = upcycle_params(source.cfg, nnx.state(source, nnx.Param).to_pure_dict(), variant)
    a, b = SWAPPED[variant]
    norms = params["layers"]["siamese"]
    norms[a], norms[b] = norms[b], norms[a]
    return Transformer.from_params(cfg, params)


@functools.cache
def _logits(eps, embed_std=None):
    """{(family, model): logits of TOKENS} for every family, `model` being "pre" (`_source(family, eps,
    embed_std=embed_std)`), each variant (`siamese_from_prenorm` of it) and, at ε = 1e-12, "swapped <variant>"
    (`_swapped`). All of them in one jitted program, run once."""
    models = {}
    for family in sorted(FAMILIES):
        source = models[family, "pre"] = _source(family, eps, embed_std=embed_std)
        for variant in VARIANTS:
            models[family, variant] = siamese_from_prenorm(source, variant)
            if eps == 1e-12:
                models[family, f"swapped {variant}"] = _swapped(source, variant)
    return dict(zip(models, map(np.asarray, _forwards(list(models.values()), TOKENS))))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_equal_in_the_eps_to_zero_limit(family, variant):
    """ε = 1e-12 ≪ ms(residual) ≈ 4e-4: κ − 1 ≈ 1e-9, below float32 resolution, so the match must be exact."""
    source = _source(family, eps=1e-12)
    upcycled = siamese_from_prenorm(source, variant)
    assert upcycled.cfg.norm == variant and source.cfg.norm == "pre"
    assert upcycled.cfg.replace(norm="pre") == source.cfg
    logits = _logits(1e-12)  # of these very constructions (`_logits`)
    want = logits[family, "pre"]
    assert np.max(np.abs(want)) > 0.1
    np.testing.assert_allclose(logits[family, variant], want, atol=1e-6, rtol=0)
    # Sensitivity: the same construction with g1/g2 swapped is visibly wrong.
    assert np.max(np.abs(logits[family, f"swapped {variant}"] - want)) > 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_checkpoint_eps_error_is_the_double_norm_factor(family, variant):
    """ε = 1e-6 and HF-scale embeddings (std 0.02): the gap is the κ factors, ≈ ε/(2m) relative, not 0.

    Post-pre has 2L + 1 doubly-normalised inputs, hybrid-pre L + 1; with m_min the smallest ms(embedding row)
    each factor is at most κ(m_min) (the residual stream grows at this init), bounding the relative gap.
    """
    eps = 1e-6
    source = _source(family, eps=eps)
    want, got = _logits(eps)[family, "pre"], _logits(eps)[family, variant]
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
    logits = _logits(1e-6, embed_std=1.0)  # the same program as the HF-scale one, other weights
    want = logits[family, "pre"]
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(logits[family, variant] / scale, want / scale, atol=1e-5, rtol=0)


def test_double_norm_factor_matches_a_double_rms_norm():
    v = np.random.default_rng(1).normal(0, 0.03, 16)
    n = lambda u, eps: u / np.sqrt(np.mean(u * u) + eps)  # noqa: E731
    for eps in (1e-6, 1e-5):
        np.testing.assert_allclose(n(n(v, eps), eps), double_norm_factor(np.mean(v * v), eps) * n(v, eps),
                                   rtol=1e-12)
    assert double_norm_factor(1 - 1e-6, 1e-6) == pytest.approx(1.0, abs=1e-15)


@functools.cache
def _adam_steps():
    """{variant: (params, gradients, loss and logits of TOKENS before, params, loss and logits after one Adam
    step)} of the variant upcycled from the ε = 1e-6 Qwen3 source: both variants in one jitted program.

    The loss is the next-token cross-entropy of TOKENS; by causality `logits[:, :-1]` are the logits of
    `TOKENS[:, :-1]`, from which it predicts `TOKENS[:, 1:]`."""
    graphdefs, params = zip(*(nnx.split(siamese_from_prenorm(_source("qwen3", eps=1e-6), v), nnx.Param)
                              for v in VARIANTS))

    @functools.partial(jax.jit, static_argnums=0)
    def steps(graphdefs, params):
        out = []
        for graphdef, p in zip(graphdefs, params):
            def loss_fn(p, graphdef=graphdef):
                logits = nnx.merge(graphdef, p)(TOKENS)
                return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], TOKENS[:, 1:]).mean(), logits

            (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
            opt = optax.adam(ADAM_LR)
            updates, _ = opt.update(grads, opt.init(p), p)
            stepped = optax.apply_updates(p, updates)
            out.append((grads, loss, logits, stepped, *loss_fn(stepped)))
        return out

    return {v: (p, *r) for v, p, r in zip(VARIANTS, params, steps(graphdefs, params))}


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_adam_step_moves_the_post_stream_gains(variant):
    """At the upcycled point the zeroed x-stream gains have non-zero gradients; one step makes x matter.

    (Run eagerly, as this test did, whichever variant ran first took ~19 s of CPU, compiling each op's
    forward, JVP and transpose and the layer scan at every call; now `_adam_steps` compiles both at once.)"""
    params, grads, loss_before, before, stepped, loss_after, after = _adam_steps()[variant]
    grads = grads.to_pure_dict()
    zeroed = ["attn_post_norm", "mlp_post_norm"] if variant == "siamese" else ["attn_norm", "mlp_norm"]
    for name in zeroed:
        start = params.to_pure_dict()["layers"]["siamese"][name]["weight"]
        np.testing.assert_array_equal(np.asarray(start), 0)
        assert np.all(np.linalg.norm(np.asarray(grads["layers"]["siamese"][name]["weight"]), axis=-1) > 1e-6)
    assert np.linalg.norm(np.asarray(grads["norm_x"]["weight"])) > 1e-6

    moved = stepped.to_pure_dict()
    for name in zeroed:  # Adam's first step is ≈ lr · sign(grad) per coordinate
        w = np.asarray(moved["layers"]["siamese"][name]["weight"])
        assert np.median(np.abs(w)) == pytest.approx(ADAM_LR, rel=0.05)
    assert np.max(np.abs(np.asarray(after) - np.asarray(before))) > 1e-3
    assert loss_after < loss_before


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
    np.testing.assert_allclose(np.asarray(_forwards([model], TOKENS)[0]), _logits(1e-12)["qwen3", "pre"],
                               atol=1e-6, rtol=0)


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
