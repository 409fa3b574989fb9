"""Golden PartitionSpec of every parameter of the tiny model and Qwen3-8B under FSDP and FSDP_TP.

The table is the contract between `models/` (logical names) and `sharding/rules.py`: a change to either shows
up here. Qwen3-8B is abstract (`Transformer.abstract`), so nothing is allocated.
"""

import jax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxrl.models import KVCache, Transformer, TransformerConfig
from jaxrl.sharding import FSDP, FSDP_TP, MeshConfig, kv_cache_shardings, make_mesh, state_shardings
from jaxrl.sharding.place import path_str

# path -> (spec under FSDP, spec under FSDP_TP)
GOLDEN = {
    "embed_tokens.embedding": (P("fsdp", None), P("tensor", "fsdp")),  # FSDP: along V (rules.py "Why not D")
    "layers.input_layernorm.weight": (P(None, "fsdp"), P(None, "fsdp")),
    "layers.mlp.down_proj.kernel": (P(None, None, "fsdp"), P(None, "tensor", "fsdp")),
    "layers.mlp.gate_proj.kernel": (P(None, "fsdp", None), P(None, "fsdp", "tensor")),
    "layers.mlp.up_proj.kernel": (P(None, "fsdp", None), P(None, "fsdp", "tensor")),
    "layers.post_attention_layernorm.weight": (P(None, "fsdp"), P(None, "fsdp")),
    "layers.self_attn.k_norm.weight": (P(None, None), P(None, None)),
    "layers.self_attn.k_proj.kernel": (P(None, "fsdp", None, None), P(None, "fsdp", "tensor", None)),
    "layers.self_attn.o_proj.kernel": (P(None, None, None, "fsdp"), P(None, "tensor", None, "fsdp")),
    "layers.self_attn.q_norm.weight": (P(None, None), P(None, None)),
    "layers.self_attn.q_proj.kernel": (P(None, "fsdp", None, None), P(None, "fsdp", "tensor", None)),
    "layers.self_attn.v_proj.kernel": (P(None, "fsdp", None, None), P(None, "fsdp", "tensor", None)),
    "lm_head.kernel": (P("fsdp", None), P("fsdp", "tensor")),
    "norm.weight": (P("fsdp"), P("fsdp")),
}
TINY_PATHS = sorted(set(GOLDEN) - {"layers.self_attn.k_norm.weight", "layers.self_attn.q_norm.weight"})


def _specs(cfg, mesh_cfg, rules):
    state = nnx.state(Transformer.abstract(cfg), nnx.Param)
    shardings = state_shardings(state, make_mesh(mesh_cfg), rules)
    flat, _ = jax.tree_util.tree_flatten_with_path(shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return {path_str(p): s.get_value().spec for p, s in flat}


@pytest.mark.parametrize("column, rules, mesh_cfg", [
    (0, FSDP, MeshConfig(data=2, fsdp=4)),
    (1, FSDP_TP, MeshConfig(fsdp=2, tensor=4, rules="fsdp_tp")),
])
@pytest.mark.parametrize("name", ["tiny", "qwen3_8b"])
def test_parameter_specs_match_golden_table(name, column, rules, mesh_cfg):
    cfg = TransformerConfig.tiny(num_kv_heads=4) if name == "tiny" else TransformerConfig.qwen3_8b()
    specs = _specs(cfg, mesh_cfg, rules)
    expected_paths = TINY_PATHS if name == "tiny" else sorted(GOLDEN)
    assert sorted(specs) == expected_paths
    for path, spec in specs.items():
        assert spec == GOLDEN[path][column], path


def test_kv_cache_specs_for_qwen3_8b():
    cfg = TransformerConfig.qwen3_8b()
    cache = jax.eval_shape(lambda: KVCache.init(cfg, 8, 64))
    sh = kv_cache_shardings(cache, make_mesh(MeshConfig(data=2, fsdp=1, tensor=4, rules="fsdp_tp")), FSDP_TP)
    assert isinstance(sh, KVCache)
    assert sh.k.spec == sh.v.spec == P(None, ("data", "fsdp"), "tensor", None, None)
    assert sh.valid_BS.spec == P(("data", "fsdp"), None) and sh.index.spec == P()
