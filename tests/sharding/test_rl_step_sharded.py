"""The trainer's jitted RL update (`jaxrl.learner.train_step.train_step`) on 8 fake CPU devices equals one device.

Meshes data=2 x fsdp=4 (FSDP rules) and fsdp=2 x tensor=4 (FSDP_TP rules); the sharded step is built exactly as
`jaxrl.rl.setup.setup` builds it (parameter / optimiser shardings from the logical-axis rules, donated state, batch
rows over data+fsdp, activation constraints at block boundaries). Compared: loss, every gradient-dependent metric,
and the updated parameters. The loss includes the clipped surrogate, a k3 KL term and the entropy bonus, with
gradient accumulation over 2 micro-batches.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig
from jaxrl.sharding import (
    FSDP, FSDP_TP, MeshConfig, batch_shardings, make_constrain, make_mesh, no_constraint, state_shardings,
)
from jaxrl.learner.train_step import LossSpec, TrainBatch, TrainState, loss_and_grad, train_step

CFG = TransformerConfig.tiny(num_kv_heads=4)
SPEC = LossSpec(kl_beta=0.05, entropy_coef=0.01, grad_accum=2, dual_clip=3.0)
MESHES = [
    pytest.param(MeshConfig(data=2, fsdp=4), FSDP, id="data2-fsdp4"),
    pytest.param(MeshConfig(fsdp=2, tensor=4, rules="fsdp_tp"), FSDP_TP, id="fsdp2-tensor4"),
]


def _batch(b=16, length=12, prompt=4) -> TrainBatch:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CFG.vocab_size, (b, length)).astype(np.int32)
    lengths = rng.integers(1, length - prompt + 1, b)
    comp = np.arange(length)[None, :] - prompt
    loss_mask = (comp >= 0) & (comp < lengths[:, None])
    mask = (np.arange(length)[None, :] < prompt) | loss_mask
    old = np.where(loss_mask, rng.normal(-3.0, 0.3, (b, length)), 0.0).astype(np.float32)
    ref = np.where(loss_mask, rng.normal(-3.0, 0.3, (b, length)), 0.0).astype(np.float32)
    adv = (rng.normal(size=(b, 1)) * loss_mask).astype(np.float32)
    c = slice(prompt, None)  # completion space
    return TrainBatch(tokens, mask, loss_mask[:, c], old[:, c], ref[:, c], adv[:, c], np.full(b, 0.2, np.float32),
                      np.full(b, 0.28, np.float32), np.zeros(b, np.float32))


def _tx():
    # eps well above gradient round-off (see test_sharded_step.py): Adam's first step is g / (|g| + eps).
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, eps=1e-4, weight_decay=0.1))


def _single_device(batch):
    graphdef, state = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0), constrain=no_constraint))
    params = state.to_pure_dict()
    tx = _tx()
    loss, grads, _ = jax.jit(functools.partial(loss_and_grad, graphdef=graphdef, spec=SPEC))(params, batch=batch)
    step = jax.jit(functools.partial(train_step, graphdef=graphdef, spec=SPEC, tx=tx))
    new_state, metrics = step(TrainState(params, tx.init(params), jnp.zeros((), jnp.int32)), batch)
    return loss, grads, new_state, metrics


@pytest.mark.slow  # two compilations of a sharded RL step per mesh on the 2-core machine
@pytest.mark.parametrize("mesh_cfg, rules", MESHES)
def test_sharded_rl_step_equals_single_device(mesh_cfg, rules):
    batch = _batch()
    ref_loss, ref_grads, ref_state, ref_metrics = _single_device(batch)

    mesh = make_mesh(mesh_cfg)
    graphdef, state = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0), constrain=make_constrain(mesh, rules)))
    param_sh = state_shardings(state, mesh, rules).to_pure_dict()
    params = jax.device_put(state.to_pure_dict(), param_sh)
    tx = _tx()
    opt_state = tx.init(params)
    opt_sh = state_shardings(opt_state, mesh, rules, params=state)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state_sh = TrainState(param_sh, opt_sh, rep)
    train_state = jax.device_put(TrainState(params, opt_state, jnp.zeros((), jnp.int32)), state_sh)
    sharded_batch = jax.device_put(batch, batch_shardings(batch, mesh, rules))

    loss, grads, _ = jax.jit(functools.partial(loss_and_grad, graphdef=graphdef, spec=SPEC))(
        params, batch=sharded_batch)
    step = jax.jit(functools.partial(train_step, graphdef=graphdef, spec=SPEC, tx=tx),
                   in_shardings=(state_sh, None), out_shardings=(state_sh, None), donate_argnums=0)
    new_state, metrics = step(train_state, sharded_batch)

    # the weights really are spread over the mesh
    kernel = new_state.params["layers"]["mlp"]["gate_proj"]["kernel"]
    assert len(kernel.sharding.device_set) == 8 and not kernel.sharding.is_fully_replicated
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-7)
    for key in ("loss", "pg/loss", "kl/loss", "entropy/mean", "train/grad_norm", "pg/clip_frac"):
        np.testing.assert_allclose(float(metrics[key]), float(ref_metrics[key]), rtol=1e-5, atol=1e-7)
    for p, r in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(ref_state.params), strict=True):
        np.testing.assert_allclose(np.asarray(p), np.asarray(r), rtol=1e-5, atol=1e-6)
