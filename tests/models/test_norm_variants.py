"""Pre / post / SiameseNorm wiring: spec worked example, float64 numpy reference, scan over depth."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig, set_params
from jaxrl.models.siamese import depth_scale, siamese_merge, siamese_sublayer
import _numpy_ref  # sibling helper module (tests/ is not a package; pytest puts this folder on sys.path)


def _layer_norm(x):
    """Non-affine LayerNorm, eps 1e-6 (the spec's DeiT norm)."""
    mean = jnp.mean(x, -1, keepdims=True)
    return (x - mean) / jnp.sqrt(jnp.mean((x - mean) ** 2, -1, keepdims=True) + 1e-6)


def test_spec_section6_worked_example_with_layernorm():
    x = y = jnp.array([1.0, 2.0, 3.0, 4.0])
    kw = dict(post_norm=_layer_norm, pre_norm=_layer_norm, in_norm=_layer_norm, scale=depth_scale(0))
    np.testing.assert_allclose(depth_scale(0), np.sqrt(2.0), rtol=1e-7)
    x, y = siamese_sublayer(x, y, lambda u: 0.5 * u, **kw)
    np.testing.assert_allclose(x, [-1.8160, -0.6053, 0.6053, 1.8160], atol=1e-4)
    np.testing.assert_allclose(y, [0.3292, 1.7764, 3.2236, 4.6708], atol=1e-4)
    x, y = siamese_sublayer(x, y, lambda u: 0.5 * u, **kw)
    np.testing.assert_allclose(x, [-1.8160, -0.6053, 0.6053, 1.8160], atol=1e-4)
    np.testing.assert_allclose(y, [-0.3416, 1.5528, 3.4472, 5.3416], atol=1e-4)
    h = siamese_merge(x, y, norm_x=_layer_norm, norm_y=_layer_norm, norm=_layer_norm)
    np.testing.assert_allclose(h, [-1.3416, -0.4472, 0.4472, 1.3416], atol=1e-4)


def test_depth_scale_values_from_spec():
    np.testing.assert_allclose(depth_scale(jnp.array([0, 1, 2, 11, 23])),
                               [1.4142, 2.0, 2.4495, 4.8990, 6.9282], atol=1e-4)


def _perturbed_model(cfg, seed):
    """A model whose every parameter is random (norm weights 1 ± 0.1, others N(0, 0.1²))."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    rng = np.random.default_rng(seed)

    def noisy(path, a):
        a = np.asarray(a)
        is_norm = "norm" in jax.tree_util.keystr(path)
        noise = rng.normal(0, 0.1, a.shape).astype(np.float32)
        return noise + (1.0 if is_norm else a)

    params = jax.tree_util.tree_map_with_path(noisy, params)
    set_params(model, params)
    return model, params


@pytest.mark.parametrize("norm", ["pre", "post", "siamese"])
@pytest.mark.parametrize("layers", [3])
def test_logits_match_float64_numpy_reference(norm, layers):
    cfg = TransformerConfig.tiny(norm=norm, num_layers=layers, family="qwen3", qk_norm=True, qkv_bias=True)
    model, params = _perturbed_model(cfg, seed=3)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 7))
    ours = np.asarray(model(jnp.asarray(tokens, jnp.int32)))
    for row in range(2):
        ref = _numpy_ref.logits(cfg, params, tokens[row])
        np.testing.assert_allclose(ours[row], ref, atol=2e-5, rtol=0)


def test_post_and_siamese_differ_from_pre_with_the_same_sublayers():
    base = TransformerConfig.tiny(num_layers=2)
    pre, pre_params = _perturbed_model(base, seed=5)
    tokens = jnp.arange(14, dtype=jnp.int32).reshape(2, 7)
    ref = np.asarray(pre(tokens))
    for norm in ("post", "siamese"):
        model = Transformer(base.replace(norm=norm), rngs=nnx.Rngs(0))
        params = nnx.state(model, nnx.Param).to_pure_dict()
        for key in ("embed_tokens", "lm_head", "norm"):
            params[key] = pre_params[key]
        for key in ("self_attn", "mlp"):
            params["layers"][key] = pre_params["layers"][key]
        set_params(model, params)
        logits = np.asarray(model(tokens))
        assert np.isfinite(logits).all()
        assert np.max(np.abs(logits - ref)) > 1e-2, norm


def _layer_loop_size(num_layers, norm):
    cfg = TransformerConfig.tiny(num_layers=num_layers, norm=norm)
    graphdef, state = nnx.split(Transformer.abstract(cfg))
    tokens = jnp.zeros((1, 4), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(tokens))(state).jaxpr
    scans = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    assert len(scans) == 1
    assert scans[0].params["length"] == num_layers
    return len(jaxpr.eqns), len(scans[0].params["jaxpr"].jaxpr.eqns)


@pytest.mark.parametrize("norm", ["pre", "post", "siamese"])
def test_program_size_does_not_grow_with_depth(norm):
    assert _layer_loop_size(2, norm) == _layer_loop_size(8, norm)
