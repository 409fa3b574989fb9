"""MeshConfig validation, make_mesh on 8 fake CPU devices, rule tables and logical_to_spec."""

import types

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, PartitionSpec as P

from jaxrl.errors import ConfigError
from jaxrl.sharding import (
    FSDP, FSDP_TP, LOGICAL_NAMES, MeshConfig, check_divisible, logical_to_spec, make_mesh,
)
from jaxrl.sharding.mesh import device_grid


@pytest.mark.parametrize(
    "cfg, shape",
    [
        (MeshConfig(), (1, 8, 1)),
        (MeshConfig(data=2, fsdp=4), (2, 4, 1)),
        (MeshConfig(data=-1, fsdp=2), (4, 2, 1)),
        (MeshConfig(data=1, fsdp=2, tensor=4, rules="fsdp_tp"), (1, 2, 4)),
        (MeshConfig(data=2, fsdp=1, tensor=-1, rules="fsdp_tp"), (2, 1, 4)),
    ],
)
def test_make_mesh_shapes_and_auto_axes(cfg, shape):
    mesh = make_mesh(cfg)
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert tuple(mesh.shape.values()) == shape
    assert mesh.axis_types == (AxisType.Auto,) * 3
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


def test_sizes_that_do_not_multiply_name_the_device_count():
    with pytest.raises(ConfigError, match=r"2x2x1 = 4 devices, but 8 devices are available"):
        make_mesh(MeshConfig(data=2, fsdp=2))
    with pytest.raises(ConfigError, match=r"fixed sizes multiply to 3, which does not divide the 8 devices"):
        make_mesh(MeshConfig(data=3, fsdp=-1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(data=-1, fsdp=-1), "at most one axis may be -1"),
        (dict(fsdp=0), r"mesh.fsdp=0: a mesh axis size must be a positive integer or -1"),
        (dict(rules="tp"), r"mesh.rules='tp': allowed values are 'fsdp', 'fsdp_tp'"),
        (dict(fsdp=2, tensor=4), r"mesh.tensor=4 but mesh.rules='fsdp' never uses the tensor axis"),
        (dict(dcn_data=0), r"mesh.dcn_data=0"),
    ],
)
def test_invalid_config_messages(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MeshConfig(**kwargs)


def test_dcn_factor_must_divide_axis():
    with pytest.raises(ConfigError, match=r"mesh.dcn_data=4 does not divide mesh.data=2"):
        MeshConfig(data=2, fsdp=-1, dcn_data=4).shape(8)


def test_hybrid_grid_puts_slices_on_the_outer_factor():
    # Fake devices of two 4-chip slices; mesh_utils groups them by `slice_index`.
    devs = [
        types.SimpleNamespace(
            id=i, slice_index=i // 4, process_index=i // 4, platform="cpu", device_kind="cpu"
        )
        for i in range(8)
    ]
    grid = device_grid(MeshConfig(data=2, fsdp=4, dcn_data=2), devs)
    assert grid.shape == (2, 4, 1)
    slices = np.vectorize(lambda d: d.slice_index)(grid)
    np.testing.assert_array_equal(slices[:, :, 0], [[0, 0, 0, 0], [1, 1, 1, 1]])
    grid = device_grid(MeshConfig(data=1, fsdp=8, dcn_fsdp=2), devs)
    slices = np.vectorize(lambda d: d.slice_index)(grid)
    np.testing.assert_array_equal(slices[0, :, 0], [0, 0, 0, 0, 1, 1, 1, 1])


def test_hybrid_grid_error_without_slices():
    with pytest.raises(ConfigError, match=r"cannot split 8 devices into 2 slices"):
        make_mesh(MeshConfig(data=2, fsdp=4, dcn_data=2))


def test_rule_tables_cover_exactly_the_logical_names():
    assert set(FSDP) == set(LOGICAL_NAMES) == set(FSDP_TP)
    for table in (FSDP, FSDP_TP):
        for axes in table.values():
            assert set(axes) <= {"data", "fsdp", "tensor"}
    assert not any("tensor" in axes for axes in FSDP.values())


@pytest.mark.parametrize(
    "names, rules, spec",
    [
        (("vocab", "embed"), FSDP, P("fsdp", None)),  # the table along V (rules.py: "Why not D")
        (("embed", "vocab"), FSDP, P("fsdp", None)),  # the head keeps D
        (("vocab", "embed"), FSDP_TP, P("tensor", "fsdp")),
        (("layers", "embed", "heads", "head_dim"), FSDP_TP, P(None, "fsdp", "tensor", None)),
        (("layers", "mlp", "embed"), FSDP_TP, P(None, "tensor", "fsdp")),
        (("layers", "embed"), FSDP, P(None, "fsdp")),
        # activations: batch takes data+fsdp, so embed (fsdp) is left whole
        (("batch", "length", "embed"), FSDP, P(("data", "fsdp"), None, None)),
        (("batch", "length", "vocab"), FSDP_TP, P(("data", "fsdp"), None, "tensor")),
        ((None, "embed"), FSDP, P(None, "fsdp")),
        ((), FSDP, P()),
    ],
)
def test_logical_to_spec(names, rules, spec):
    assert logical_to_spec(names, rules) == spec


def test_vocab_is_split_only_where_it_divides():
    sizes = {"data": 2, "fsdp": 4, "tensor": 1}
    assert logical_to_spec(("vocab", "embed"), FSDP, (151936, 64), sizes) == P("fsdp", None)
    # a built-in character vocabulary: fsdp goes to D, the layout every tensor had before
    assert logical_to_spec(("vocab", "embed"), FSDP, (102, 64), sizes) == P(None, "fsdp")
    assert logical_to_spec(("batch", "vocab"), FSDP, (6, 102), sizes) == P(("data", "fsdp"), None)


def test_unknown_logical_name():
    with pytest.raises(ValueError, match=r"unknown logical axis name 'hidden'"):
        logical_to_spec(("hidden",), FSDP)


def test_divisibility_error_names_tensor_dimension_size_and_axis():
    mesh = Mesh(np.array(jax.devices()).reshape(1, 2, 4), ("data", "fsdp", "tensor"))
    check_divisible((8, 12), P("tensor", "fsdp"), mesh, what="ok")
    with pytest.raises(ConfigError) as e:
        check_divisible((6, 32), P("tensor", "fsdp"), mesh, what="layers.self_attn.k_proj")
    assert str(e.value).startswith(
        "layers.self_attn.k_proj: dimension 0 of shape (6, 32) has size 6, which is not divisible by "
        "mesh axis tensor=4 (4 ways)"
    )
    with pytest.raises(ConfigError, match=r"size 6, which is not divisible by mesh axis data=1 x fsdp=2 x"):
        check_divisible((6,), P(("data", "fsdp", "tensor")), mesh, what="x")
