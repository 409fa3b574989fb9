"""The train step's policy objectives and mismatch weights are the library's per-token functions, aggregated once.

For each built-in objective (`jaxrl.learner.objectives.OBJECTIVES`), the step's loss equals
`aggregate(objective_BT)` computed here from the library function on the same log-probs (float32, tiny model,
one device); importance weights of the mismatch correction scale the policy term token by token; a user's
objective record with a parameter reaches the loss.

Compiling dominates on the tiny model, so every step loss of the file is computed in one jitted program
(`step_losses`; its gradients are not returned, so XLA drops the backward pass) and every library reference in
another (`expected`), instead of two programs per test.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl import losses
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.learner.objectives import OBJECTIVES
from jaxrl.learner.train_step import LossSpec, TrainBatch, loss_and_grad, token_logprobs

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


# the built-in objectives (user records registered by other tests in this process are not these tests')
KWARGS = {"ppo_clip": {}, "gspo": {"clip_low": 3e-4, "clip_high": 4e-4},
          "gspo_token": {"clip_low": 3e-4, "clip_high": 4e-4}, "cispo": {"w_max": 1.28, "w_min": None},
          "sapo": {"tau_pos": 1.0, "tau_neg": 1.05}}
WEIGHTED = "weighted (ppo_clip)"  # the default objective with importance weights
UNWEIGHTED = "unweighted (default spec)"


@pytest.fixture(scope="module")
def weights_BT():
    return jnp.asarray(np.random.default_rng(1).uniform(0.5, 2.0, (B, T)), jnp.float32)


@pytest.fixture(scope="module")
def step_losses(parts, batch_logp, weights_BT):
    """{objective: (loss, metrics["pg/loss"])} of the train step's `loss_and_grad` with each objective of
    `OBJECTIVES`, and with the default spec with and without importance weights (WEIGHTED, UNWEIGHTED)."""
    graphdef, params = parts
    batch, _ = batch_logp

    @jax.jit
    def run(params, batch, w_BT):
        out = {name: loss_and_grad(params, graphdef, batch, LossSpec(
            objective=name, objective_kwargs=tuple(sorted(KWARGS[name].items())))) for name in KWARGS}
        out[UNWEIGHTED] = loss_and_grad(params, graphdef, batch, LossSpec())
        out[WEIGHTED] = loss_and_grad(params, graphdef, batch.replace(is_weight_BT=w_BT), LossSpec())
        return {name: (loss, metrics["pg/loss"]) for name, (loss, _, metrics) in out.items()}

    return jax.device_get(run(params, batch, weights_BT))


def _library_objective_BT(name, logp, batch):
    """The per-token objective of `name` from the library's function, on the step's log-probs."""
    if name == "ppo_clip":
        ref_BT, _ = losses.clipped_objective(logp, batch.old_logp_BT, batch.adv_BT, batch.completion_mask_BT,
                                             clip_low=batch.clip_low_B, clip_high=batch.clip_high_B)
        return ref_BT
    fn = {"gspo": functools.partial(losses.gspo_objective, token_level=False),
          "gspo_token": functools.partial(losses.gspo_objective, token_level=True),
          "cispo": losses.cispo_objective, "sapo": losses.sapo_objective}[name]
    ref_BT, _ = fn(logp, batch.old_logp_BT, batch.adv_BT, batch.completion_mask_BT, **KWARGS[name])
    return ref_BT


@pytest.fixture(scope="module")
def expected(batch_logp, weights_BT):
    """{objective: aggregate(library objective_BT)}, and WEIGHTED: aggregate(ppo_clip_BT * weights_BT)."""
    batch, logp = batch_logp

    @jax.jit
    def reference(logp, batch, w_BT):
        m_BT = batch.completion_mask_BT
        out = {name: losses.aggregate(_library_objective_BT(name, logp, batch), m_BT, "token-mean")
               for name in KWARGS}
        out[WEIGHTED] = losses.aggregate(_library_objective_BT("ppo_clip", logp, batch) * w_BT, m_BT, "token-mean")
        return out

    return jax.device_get(reference(logp, batch, weights_BT))


@pytest.mark.parametrize("name", sorted(KWARGS))
def test_step_loss_is_the_library_objective_aggregated(step_losses, expected, name):
    loss, pg_loss = step_losses[name]
    assert OBJECTIVES[name].name == name  # a registered built-in
    assert abs(float(expected[name])) > 1e-4  # not trivially zero
    np.testing.assert_allclose(float(loss), float(expected[name]), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(pg_loss), float(expected[name]), rtol=1e-5, atol=1e-7)


def test_importance_weights_scale_the_policy_term_per_token(step_losses, expected):
    plain, _ = step_losses[UNWEIGHTED]
    weighted, _ = step_losses[WEIGHTED]
    np.testing.assert_allclose(float(weighted), float(expected[WEIGHTED]), rtol=1e-5, atol=1e-7)
    assert abs(float(weighted) - float(plain)) > 1e-5


def test_a_user_objective_and_its_parameter_reach_the_step_loss(parts, batch_logp, step_losses):
    """`algorithm.objective.name` naming a record in a test file (`test_toy_algorithm.py:TOY_SCALED`: PPO's
    clip times `scale`), its `params` checked at load: the step's loss is `scale` times ppo_clip's."""
    from jaxrl.algorithms import ALGORITHMS
    from jaxrl.config import load_config
    from jaxrl.rl.setup import algo_settings, loss_spec

    graphdef, params = parts
    batch, _ = batch_logp
    toy = f"{Path(__file__).resolve().parent / 'test_toy_algorithm.py'}:TOY_SCALED"
    cfg = load_config(None, [f"algorithm.objective.name={toy}", "algorithm.objective.params.scale=3",
                             "algorithm.agg_mode=token-mean"])
    spec = loss_spec(cfg, ALGORITHMS[cfg.algorithm.name], algo_settings(cfg))
    assert (spec.objective, spec.objective_kwargs) == (toy, (("scale", 3.0),))
    loss, _, _ = jax.jit(lambda p, b: loss_and_grad(p, graphdef, b, LossSpec(
        objective=spec.objective, objective_kwargs=spec.objective_kwargs)))(params, batch)
    np.testing.assert_allclose(float(loss), 3 * float(step_losses["ppo_clip"][0]), rtol=1e-5)
