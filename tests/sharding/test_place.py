"""state_shardings / kv_cache_shardings / batch_shardings / make_constrain on 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl.errors import ConfigError
from jaxrl.sharding import FSDP, FSDP_TP, MeshConfig, make_mesh, param
from jaxrl.sharding.place import (
    abstract_with_shardings, batch_shardings, kv_cache_shardings, make_constrain, state_shardings,
)


class Toy(nnx.Module):
    def __init__(self, d=8, f=12, v=16):
        self.embed = param(jnp.arange(v * d, dtype=jnp.float32).reshape(v, d), ("vocab", "embed"))
        self.up = param(jnp.ones((2, d, f)), ("layers", "embed", "mlp"))
        self.scale = nnx.Param(jnp.ones((d,)))  # unnamed: replicated


def _specs(tree):
    return [s.spec for s in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def mesh_tp():
    return make_mesh(MeshConfig(data=1, fsdp=2, tensor=4, rules="fsdp_tp"))


def test_params_and_variable_optimizer_state(mesh_tp):
    _, state = nnx.split(Toy())
    sh = state_shardings(state, mesh_tp, FSDP_TP)
    assert sh["embed"].get_value().spec == P("tensor", "fsdp")
    assert sh["up"].get_value().spec == P(None, "fsdp", "tensor")
    assert sh["scale"].get_value().spec == P()
    opt = optax.adamw(1e-3).init(state)
    count, *moments = _specs(state_shardings(opt, mesh_tp, FSDP_TP))
    assert count == P()
    assert moments == [P("tensor", "fsdp"), P(), P(None, "fsdp", "tensor")] * 2


def test_pure_array_moments_mirror_params_by_path(mesh_tp):
    _, state = nnx.split(Toy())
    opt = optax.adamw(1e-3).init(nnx.to_pure_dict(state))
    sh = state_shardings(opt, mesh_tp, FSDP_TP, params=state)
    assert sh[0].mu["embed"].spec == P("tensor", "fsdp")
    assert sh[0].nu["up"].spec == P(None, "fsdp", "tensor")
    assert sh[0].count.spec == P()
    # without params the unnamed moments are replicated
    assert set(_specs(state_shardings(opt, mesh_tp, FSDP_TP))) == {P()}


def test_device_put_and_jit_with_donation_keep_layout(mesh_tp):
    _, state = nnx.split(Toy())
    sh = state_shardings(state, mesh_tp, FSDP_TP)
    placed = jax.device_put(state, sh)
    emb = placed["embed"].get_value()
    assert emb.sharding.spec == P("tensor", "fsdp")
    # each device holds a (16/4, 8/2) block
    assert {s.data.shape for s in emb.addressable_shards} == {(4, 4)}
    step = jax.jit(lambda s: jax.tree.map(lambda a: 2 * a, s), in_shardings=(sh,), out_shardings=sh,
                   donate_argnums=0)
    out = step(placed)
    np.testing.assert_array_equal(np.asarray(out["embed"].get_value()), 2 * np.arange(128.0).reshape(16, 8))
    assert out["up"].get_value().sharding.spec == P(None, "fsdp", "tensor")


def test_abstract_state_and_restore_targets(mesh_tp):
    abstract = nnx.split(nnx.eval_shape(lambda: Toy()))[1]
    sh = state_shardings(abstract, mesh_tp, FSDP_TP)
    target = abstract_with_shardings(abstract, sh)
    leaf = target["up"].get_value()
    assert isinstance(leaf, jax.ShapeDtypeStruct) and leaf.shape == (2, 8, 12)
    assert leaf.sharding.spec == P(None, "fsdp", "tensor")


def test_indivisible_parameter_names_path_dimension_size_axis(mesh_tp):
    _, state = nnx.split(Toy(f=6))
    with pytest.raises(ConfigError) as e:
        state_shardings(state, mesh_tp, FSDP_TP)
    assert str(e.value).startswith(
        "up: dimension 2 of shape (2, 8, 6) has size 6, which is not divisible by mesh axis tensor=4 (4 ways)"
    )


def test_kv_cache_and_batch_shardings():
    mesh = make_mesh(MeshConfig(data=2, fsdp=1, tensor=4, rules="fsdp_tp"))
    cache = {
        "k": jax.ShapeDtypeStruct((3, 4, 8, 16, 2), jnp.bfloat16),
        "v": jax.ShapeDtypeStruct((3, 4, 8, 16, 2), jnp.bfloat16),
        "valid_BS": jax.ShapeDtypeStruct((4, 16), jnp.bool_),
        "index": jax.ShapeDtypeStruct((), jnp.int32),
    }
    sh = kv_cache_shardings(cache, mesh, FSDP_TP)
    assert sh["k"].spec == P(None, ("data", "fsdp"), "tensor", None, None)
    assert sh["valid_BS"].spec == P(("data", "fsdp"), None)
    assert sh["index"].spec == P()
    assert kv_cache_shardings(cache, mesh, FSDP)["v"].spec == P(None, ("data", "fsdp"), None, None, None)
    with pytest.raises(ConfigError, match=r"kv_cache.k: dimension 1 of shape \(3, 3, 16, 8, 2\) has size 3"):
        kv_cache_shardings({"k": jax.ShapeDtypeStruct((3, 3, 16, 8, 2), jnp.float32)}, mesh, FSDP_TP)
    batch = {"tokens_BL": jnp.zeros((4, 5), jnp.int32), "adv_B": jnp.zeros((4,))}
    bsh = batch_shardings(batch, mesh, FSDP)
    assert bsh["tokens_BL"].spec == P(("data", "fsdp"), None) and bsh["adv_B"].spec == P(("data", "fsdp"))


def test_constrain_places_activations_inside_jit():
    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    x_BLD = jnp.arange(8 * 3 * 4, dtype=jnp.float32).reshape(8, 3, 4)
    for constrain in (make_constrain(mesh, FSDP), make_constrain(mesh, FSDP, strict=True)):
        y = jax.jit(lambda x: constrain(x * 1.0, ("batch", "length", "embed")))(x_BLD)
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"), None, None)), 3)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x_BLD))


def test_constrain_uneven_batch_falls_back_to_a_dividing_prefix_unless_strict():
    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    x_BLD = jnp.ones((6, 3, 4))
    y = jax.jit(lambda x: make_constrain(mesh, FSDP)(x * 2.0, ("batch", "length", "embed")))(x_BLD)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None, None)), 3)  # 6 rows: 2 ways
    np.testing.assert_array_equal(np.asarray(y), 2 * np.ones((6, 3, 4)))
    y = jax.jit(lambda x: make_constrain(mesh, FSDP)(x, ("batch", "length", "embed")))(jnp.ones((3, 2, 4)))
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P()), 3)  # 3 rows: replicated
    strict = make_constrain(mesh, FSDP, strict=True)
    msg = r"activation \('batch', 'length', 'embed'\): dimension 0 .* size 6"
    with pytest.raises(ConfigError, match=msg):
        jax.jit(lambda x: strict(x, ("batch", "length", "embed")))(x_BLD)
