"""TransformerConfig validation and presets; hf_io config translation and bad-input errors."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Llama3RopeScaling, Transformer, TransformerConfig, hf_io, testing
from jaxrl.sharding import logical_names

PRESETS = ["tiny", "smollm2_135m", "qwen2_5_0_5b", "qwen2_5_1_5b", "qwen3_0_6b", "qwen3_1_7b", "qwen3_8b"]


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_hashable_and_survive_hf_round_trip(name):
    cfg = getattr(TransformerConfig, name)()
    hash(cfg)
    assert hf_io.config_from_hf(hf_io.config_to_hf(cfg)) == cfg


def test_preset_parameter_counts_match_published_sizes():
    """Abstract construction (no allocation) gives the published parameter counts."""
    def count(cfg):
        leaves = jax.tree.leaves(nnx.state(Transformer.abstract(cfg), nnx.Param))
        return sum(int(np.prod(x.shape)) for x in leaves)

    assert count(TransformerConfig.smollm2_135m()) == 134_515_008
    assert count(TransformerConfig.qwen3_0_6b()) == 596_049_920
    assert count(TransformerConfig.qwen2_5_0_5b()) == 494_032_768


@pytest.mark.parametrize("change,match", [
    (dict(num_heads=3), "multiple of num_kv_heads"),
    (dict(head_dim=7), "even"),
    (dict(norm="sandwich"), "norm='sandwich'"),
    (dict(dtype="float16"), "dtype"),
    (dict(remat="some"), "remat"),
    (dict(family="gpt2"), "family"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(rope_theta=0.0), "rope_theta"),
    (dict(rope_scaling={"factor": 8}), "Llama3RopeScaling"),
])
def test_config_rejects_bad_values_with_named_field(change, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig.tiny(**change)


def test_rope_scaling_validation():
    with pytest.raises(ValueError, match="low_freq_factor < high_freq_factor"):
        Llama3RopeScaling(factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
                          original_max_position_embeddings=8)


def test_config_from_hf_reads_legacy_and_transformers5_rope_keys():
    base = hf_io.config_to_hf(testing.TINY_CONFIGS["llama3_rope_scaling"])
    new_style = hf_io.config_from_hf(base)
    legacy = dict(base)
    rope = legacy.pop("rope_parameters")
    legacy["rope_theta"] = rope.pop("rope_theta")
    legacy["rope_scaling"] = {**rope, "rope_type": "llama3"}
    assert hf_io.config_from_hf(legacy) == new_style
    assert new_style.rope_scaling == testing.TINY_CONFIGS["llama3_rope_scaling"].rope_scaling
    plain = {k: v for k, v in base.items() if k != "rope_parameters"} | {"rope_theta": 5000.0}
    assert hf_io.config_from_hf(plain).rope_theta == 5000.0
    assert hf_io.config_from_hf(plain).rope_scaling is None
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        hf_io.config_from_hf(base | {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}})


def test_config_from_hf_unknown_architecture_lists_supported():
    d = hf_io.config_to_hf(TransformerConfig.tiny()) | {"architectures": ["GPT2LMHeadModel"]}
    supported = r"GPT2LMHeadModel.*LlamaForCausalLM.*Qwen2ForCausalLM.*Qwen3ForCausalLM"
    with pytest.raises(ValueError, match=supported):
        hf_io.config_from_hf(d)


def test_config_from_hf_remote_architecture_reads_norm():
    cfg = TransformerConfig.tiny(norm="siamese", family="qwen3", qk_norm=True)
    d = hf_io.config_to_hf(cfg) | {"architectures": ["JaxrlForCausalLM"], "norm": "siamese", "qk_norm": True}
    assert hf_io.config_from_hf(d) == cfg


def test_config_to_hf_rejects_switches_the_family_cannot_express():
    with pytest.raises(ValueError, match="qk_norm"):
        hf_io.config_to_hf(TransformerConfig.tiny(qk_norm=True))


def _tiny_sd(cfg):
    params = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param).to_pure_dict()
    return dict(hf_io.params_to_hf(cfg, params))


def test_hf_to_params_missing_tensor_is_named():
    cfg = TransformerConfig.tiny()
    sd = _tiny_sd(cfg)
    del sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        hf_io.hf_to_params(cfg, sd.__getitem__)


def test_hf_to_params_wrong_shape_names_tensor_expected_and_found():
    cfg = TransformerConfig.tiny()
    sd = _tiny_sd(cfg)
    sd["model.layers.0.self_attn.k_proj.weight"] = np.zeros((32, 32), np.float32)
    with pytest.raises(ValueError, match=r"k_proj\.weight.*expected shape \(16, 32\), found \(32, 32\)"):
        hf_io.hf_to_params(cfg, sd.__getitem__)


def test_hf_names_for_post_and_siamese_and_tied():
    post = hf_io.hf_shapes(TransformerConfig.tiny(norm="post"))
    assert "model.layers.0.post_feedforward_layernorm.weight" in post
    assert "model.layers.0.input_layernorm.weight" not in post
    siamese = hf_io.hf_shapes(TransformerConfig.tiny(norm="siamese", tie_embeddings=True))
    extra = {"model.norm_x.weight", "model.norm_y.weight", "model.layers.1.siamese.mlp_in_norm.weight"}
    assert extra <= set(siamese)
    assert "lm_head.weight" not in siamese
    assert sum(".siamese." in k for k in siamese) == 6 * 2


def test_bf16_params_and_streaming_order():
    """hf_to_params casts to param_dtype and asks for each tensor exactly once."""
    cfg = TransformerConfig.tiny(param_dtype="bfloat16", dtype="bfloat16")
    sd = _tiny_sd(TransformerConfig.tiny())
    asked = []
    params = hf_io.hf_to_params(cfg, lambda name: asked.append(name) or sd[name])
    assert sorted(asked) == sorted(sd) and len(asked) == len(set(asked))
    assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(params))
    model = Transformer.from_params(cfg, params)
    assert model.embed_tokens.embedding[...].dtype == jax.numpy.bfloat16


def test_every_param_has_logical_names_and_stacked_ones_lead_with_layers():
    cfg = TransformerConfig.tiny(norm="siamese", qkv_bias=True, qk_norm=True)
    model = Transformer.abstract(cfg)
    allowed = {"layers", "embed", "mlp", "heads", "kv_heads", "head_dim", "vocab"}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = logical_names(var)
        assert names is not None and len(names) == len(var.shape), path
        assert set(names) <= allowed, path
        assert (names[0] == "layers") == (path[0] == "layers"), path


def test_set_params_errors_name_the_parameter():
    cfg = TransformerConfig.tiny()
    params = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param).to_pure_dict()
    bad = jax.tree.map(lambda x: x, params)
    bad["norm"]["weight"] = np.zeros((31,), np.float32)
    with pytest.raises(ValueError, match=r"norm/weight: expected shape \(32,\), found \(31,\)"):
        Transformer.from_params(cfg, bad)
    del bad["norm"]
    with pytest.raises(KeyError, match="norm/weight"):
        Transformer.from_params(cfg, bad)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TransformerConfig.tiny().num_layers = 3


def test_constrain_is_applied_to_block_boundary_activations():
    seen = []

    def record(x, names):
        seen.append((x.shape, names))
        return x

    cfg = TransformerConfig.tiny(norm="siamese")
    model = Transformer(cfg, rngs=nnx.Rngs(0), constrain=record)
    model(jax.numpy.zeros((2, 5), jax.numpy.int32))
    # embedding output, both streams after the (scanned) block, final hidden state
    assert seen == [((2, 5, 32), ("batch", "length", "embed"))] * 4
