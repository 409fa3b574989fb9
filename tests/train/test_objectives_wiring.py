"""The train step's policy objectives and mismatch weights are the library's per-token functions, aggregated once.

For each objective in `train_step.OBJECTIVES`, the step's loss equals `aggregate(objective_BT)` computed here
from the library function on the same log-probs (float32, tiny model, one device); importance weights of the
mismatch correction scale the policy term token by token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl import losses
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.train_step import LossSpec, OBJECTIVES, TrainBatch, loss_and_grad, token_logprobs

B, W, T = 4, 3, 5


def _init():
    return Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def parts():
    # the initialisation jitted (one program instead of one per eager op) without LLVM optimisation (it runs
    # once: 1 s of compilation instead of 5); the graphdef from its shapes
    graphdef, _ = nnx.split(nnx.eval_shape(_init))
    init = jax.jit(lambda: nnx.split(_init())[1].to_pure_dict(),
                   compiler_options={"xla_backend_optimization_level": 0})
    return graphdef, init()


def _logprobs(params, graphdef, tokens, mask):
    """`token_logprobs` of the last T tokens, jitted (the same program for every test)."""
    fn = lambda p, t, m: token_logprobs(nnx.merge(graphdef, p), t, m, T, chunk=8192)[0]
    return jax.jit(fn)(params, tokens, mask)


@pytest.fixture(scope="module")
def batch_logp(parts):
    """(the batch, the current log-probs of its completions): the same for every test, built once."""
    graphdef, params = parts
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 64, size=(B, W + T)).astype(np.int32)
    lengths = np.array([5, 3, 1, 4])
    cmask = np.arange(T)[None, :] < lengths[:, None]
    mask = np.concatenate([np.ones((B, W), bool), cmask], axis=1)
    logp = _logprobs(params, graphdef, jnp.asarray(tokens), jnp.asarray(mask))
    # behaviour log-probs near the current ones, so ratios are informative but not all clipped
    old = np.where(cmask, np.asarray(logp) + rng.normal(0, 0.2, (B, T)), 0.0).astype(np.float32)
    adv = np.where(cmask, rng.normal(size=(B, 1)), 0.0).astype(np.float32)
    batch = TrainBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(cmask), jnp.asarray(old),
                       jnp.zeros((B, T)), jnp.asarray(adv), jnp.full((B,), 0.2), jnp.full((B,), 0.28),
                       jnp.zeros((B,)))
    return batch, logp


KWARGS = {"ppo_clip": {}, "gspo": {"clip_low": 3e-4, "clip_high": 4e-4},
          "gspo_token": {"clip_low": 3e-4, "clip_high": 4e-4}, "cispo": {"w_max": 1.28, "w_min": None},
          "sapo": {"tau_pos": 1.0, "tau_neg": 1.05}}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_step_loss_is_the_library_objective_aggregated(parts, batch_logp, name):
    graphdef, params = parts
    batch, logp = batch_logp
    spec = LossSpec(objective=name, objective_kwargs=tuple(sorted(KWARGS[name].items())))
    loss, _, metrics = jax.jit(functools.partial(loss_and_grad, graphdef=graphdef, spec=spec))(params, batch=batch)

    @jax.jit
    def reference(logp, batch):
        if name == "ppo_clip":
            ref_BT, _ = losses.clipped_objective(logp, batch.old_logp_BT, batch.adv_BT,
                                                 batch.completion_mask_BT, clip_low=batch.clip_low_B,
                                                 clip_high=batch.clip_high_B)
        else:
            fn = {"gspo": functools.partial(losses.gspo_objective, token_level=False),
                  "gspo_token": functools.partial(losses.gspo_objective, token_level=True),
                  "cispo": losses.cispo_objective, "sapo": losses.sapo_objective}[name]
            ref_BT, _ = fn(logp, batch.old_logp_BT, batch.adv_BT, batch.completion_mask_BT, **KWARGS[name])
        return losses.aggregate(ref_BT, batch.completion_mask_BT, "token-mean")

    expected = reference(logp, batch)
    assert abs(float(expected)) > 1e-4  # not trivially zero
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(metrics["pg/loss"]), float(expected), rtol=1e-5, atol=1e-7)


def test_importance_weights_scale_the_policy_term_per_token(parts, batch_logp):
    graphdef, params = parts
    batch, logp = batch_logp
    w_BT = jnp.asarray(np.random.default_rng(1).uniform(0.5, 2.0, (B, T)), jnp.float32)
    step = jax.jit(functools.partial(loss_and_grad, graphdef=graphdef, spec=LossSpec()))
    plain, _, _ = step(params, batch=batch)
    weighted, _, _ = step(params, batch=batch.replace(is_weight_BT=w_BT))

    @jax.jit
    def reference(logp, batch, w_BT):
        pg_BT, _ = losses.clipped_objective(logp, batch.old_logp_BT, batch.adv_BT, batch.completion_mask_BT,
                                            clip_low=batch.clip_low_B, clip_high=batch.clip_high_B)
        return losses.aggregate(pg_BT * w_BT, batch.completion_mask_BT, "token-mean")

    expected = reference(logp, batch, w_BT)
    np.testing.assert_allclose(float(weighted), float(expected), rtol=1e-5, atol=1e-7)
    assert abs(float(weighted) - float(plain)) > 1e-5
