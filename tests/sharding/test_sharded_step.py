"""A sharded forward and AdamW step of the tiny model on 8 fake CPU devices equal the single-device ones.

Meshes: data=2 x fsdp=4 (FSDP rules) and fsdp=2 x tensor=4 (FSDP_TP rules). The step is a plain `jax.jit`
with explicit in/out shardings from `state_shardings` and donated state, as the trainer runs it.
"""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig
from jaxrl.sharding import (
    FSDP, FSDP_TP, MeshConfig, batch_shardings, make_constrain, make_mesh, no_constraint, state_shardings,
)

CFG = TransformerConfig.tiny(num_kv_heads=4)  # 4 kv heads so that tensor=4 divides them
MESHES = [
    pytest.param(MeshConfig(data=2, fsdp=4), FSDP, id="data2-fsdp4"),
    pytest.param(MeshConfig(fsdp=2, tensor=4, rules="fsdp_tp"), FSDP_TP, id="fsdp2-tensor4"),
]


def _tokens_BL():
    return jax.random.randint(jax.random.key(1), (8, 12), 0, CFG.vocab_size)


def _loss(graphdef, params, tokens_BL):
    """Next-token cross-entropy, mean over tokens."""
    logits_BLV = nnx.merge(graphdef, params)(tokens_BL[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits_BLV, tokens_BL[:, 1:]).mean()


def _step_fn(graphdef, tx):
    def step(params, opt_state, tokens_BL):
        loss, grads = jax.value_and_grad(lambda p: _loss(graphdef, p, tokens_BL))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    return step


def _model(constrain):
    return Transformer(CFG, rngs=nnx.Rngs(0), constrain=constrain)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _assert_trees_close(a, b, **tol):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_allclose(x, y, **tol)


@pytest.mark.parametrize("mesh_cfg, rules", MESHES)
def test_sharded_forward_equals_single_device(mesh_cfg, rules):
    tokens_BL = _tokens_BL()
    ref_BLV = _model(no_constraint)(tokens_BL)
    mesh = make_mesh(mesh_cfg)
    graphdef, state = nnx.split(_model(make_constrain(mesh, rules)))
    shardings = state_shardings(state, mesh, rules)
    state = jax.device_put(state, shardings)
    tokens = jax.device_put(tokens_BL, batch_shardings(tokens_BL, mesh, rules))
    fwd = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t), in_shardings=(shardings, tokens.sharding))
    out_BLV = fwd(state, tokens)
    assert len(out_BLV.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(out_BLV), np.asarray(ref_BLV), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # ~10 s alone, 40 s on the shared 2-core machine (two compilations of a train step)
@pytest.mark.parametrize("mesh_cfg, rules", MESHES)
def test_sharded_adamw_step_equals_single_device(mesh_cfg, rules):
    tokens_BL = _tokens_BL()
    # eps well above the gradient round-off: Adam's first step is g / (|g| + eps), which turns reduction-order
    # differences in near-zero gradients into O(lr) differences when eps is tiny.
    tx = optax.adamw(1e-2, eps=1e-4, weight_decay=0.1)

    graphdef, params = nnx.split(_model(no_constraint), nnx.Param)
    ref_step = jax.jit(_step_fn(graphdef, tx))
    ref_params, ref_opt, ref_loss, ref_grads = ref_step(params, tx.init(params), tokens_BL)

    mesh = make_mesh(mesh_cfg)
    graphdef, params = nnx.split(_model(make_constrain(mesh, rules)), nnx.Param)
    p_sh = state_shardings(params, mesh, rules)
    opt_state = tx.init(params)
    o_sh = state_shardings(opt_state, mesh, rules, params=params)
    t_sh = batch_shardings(tokens_BL, mesh, rules)
    step = jax.jit(
        _step_fn(graphdef, tx),
        in_shardings=(p_sh, o_sh, t_sh),
        out_shardings=(p_sh, o_sh, None, p_sh),
        donate_argnums=(0, 1),
    )
    params, opt_state = jax.device_put(params, p_sh), jax.device_put(opt_state, o_sh)
    new_params, new_opt, loss, grads = step(params, opt_state, jax.device_put(tokens_BL, t_sh))

    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    _assert_trees_close(grads, ref_grads, rtol=1e-4, atol=1e-6)
    _assert_trees_close(new_params, ref_params, rtol=1e-5, atol=1e-6)
    _assert_trees_close(new_opt, ref_opt, rtol=1e-4, atol=1e-8)
    # the updated parameters keep the planned layout (FSDP over `embed`, TP over heads/mlp/vocab)
    for got, want in zip(jax.tree.leaves(new_params), jax.tree.leaves(p_sh), strict=True):
        assert got.sharding.is_equivalent_to(want, got.ndim)
    assert params["embed_tokens"]["embedding"].get_value().is_deleted()  # donated
