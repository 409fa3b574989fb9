"""Adapter and quantised-kernel shardings on 8 fake CPU devices (tests/conftest.py sets the device count):
specs follow the kernels' logical names, and a sharded jitted merge equals the single-device one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxrl.errors import ConfigError
from jaxrl.models import Transformer, TransformerConfig, lora, quant
from jaxrl.sharding import FSDP, FSDP_TP, MeshConfig, make_mesh, state_shardings
from jaxrl.sharding.lora import adapter_shardings, quantized_kernel_shardings

CFG = TransformerConfig.tiny()  # D 32, N 4, K 2, H 8, F 64, Y 2


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8
    return make_mesh(MeshConfig(data=1, fsdp=4, tensor=2, rules="fsdp_tp"))


def _setup():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    ad = lora.init_adapters(params, lora.LoraConfig(rank=4), jax.random.key(0))
    return model, params, jax.tree.map(lambda x: x + 0.05, ad)


def test_adapter_specs_follow_their_kernels(mesh):
    _, _, ad = _setup()
    specs = jax.tree.map(lambda s: s.spec, adapter_shardings(ad, mesh, FSDP_TP))
    att, mlp = specs["layers"]["self_attn"], specs["layers"]["mlp"]
    assert att["q_proj"] == {"lora_a": P(None, "fsdp", None), "lora_b": P(None, None, "tensor", None)}
    assert att["k_proj"]["lora_b"] == P(None, None, "tensor", None)
    assert att["o_proj"] == {"lora_a": P(None, "tensor", None, None), "lora_b": P(None, None, "fsdp")}
    assert mlp["gate_proj"] == {"lora_a": P(None, "fsdp", None), "lora_b": P(None, None, "tensor")}
    assert mlp["down_proj"] == {"lora_a": P(None, "tensor", None), "lora_b": P(None, None, "fsdp")}
    fsdp = jax.tree.map(lambda s: s.spec, adapter_shardings(ad, mesh, FSDP))
    down = fsdp["layers"]["mlp"]["down_proj"]
    assert down == {"lora_a": P(None, None, None), "lora_b": P(None, None, "fsdp")}


def test_sharded_merge_equals_single_device_and_keeps_kernel_layout(mesh):
    model, params, ad = _setup()
    lcfg = lora.LoraConfig(rank=4)
    p_sh = state_shardings(nnx.state(model, nnx.Param), mesh, FSDP_TP).to_pure_dict()
    a_sh = adapter_shardings(ad, mesh, FSDP_TP)
    merge = jax.jit(lambda p, a: lora.merge(p, a, lcfg), in_shardings=(p_sh, a_sh), out_shardings=p_sh)
    got = merge(jax.device_put(params, p_sh), jax.device_put(ad, a_sh))
    want = lora.merge(params, ad, lcfg)
    q = got["layers"]["self_attn"]["q_proj"]["kernel"]
    assert q.sharding.spec == P(None, "fsdp", "tensor", None)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-7)


def test_quantised_kernel_shardings_and_divisibility_error(mesh):
    _, params, _ = _setup()
    qp = quant.quantize_params(params, "int8")
    q = qp["layers"]["self_attn"]["o_proj"]["kernel"]
    sh = quantized_kernel_shardings(q, "o_proj", mesh, FSDP_TP)
    assert (sh.codes.spec, sh.scale.spec) == (P(None, "tensor", "fsdp"), P(None, "fsdp"))
    placed = jax.device_put(q, sh)
    np.testing.assert_array_equal(quant.dequantize(placed), quant.dequantize(q))
    nf4 = quant.quantize(params["layers"]["mlp"]["up_proj"]["kernel"], 1, "nf4", block=32)
    assert quantized_kernel_shardings(nf4, "up_proj", mesh, FSDP_TP).codes.spec == P(None, "tensor", "fsdp")
    ad3 = lora.init_adapters(params, lora.LoraConfig(rank=4), jax.random.key(0))
    ad3["layers"]["self_attn"]["q_proj"]["lora_a"] = jnp.zeros((2, 30, 4))  # 30 rows over fsdp=4
    with pytest.raises(ConfigError, match=r"layers.self_attn.q_proj.lora_a: dimension 1 .* size 30"):
        adapter_shardings(ad3, mesh, FSDP_TP)
