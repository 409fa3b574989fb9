"""Gradient accumulation equals the full-batch gradient, and ETR(α=β=0) is GRPO through the train step.

Runs in-process on one device of the 8 fake CPU devices (no mesh needed: arrays stay on the default device).
Compiling dominates on the tiny model, so the file compiles few programs: the four aggregation modes' losses
and gradients are traced into one program per `grad_accum` (4 modes in one program compile in about a third
of the time of 4 programs), and the ETR and compiler-option tests share one jitted train step.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl.algorithms import ALGORITHMS, AlgoSettings, ETRParams
from jaxrl.config import AlgorithmConfig
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.learner.train_step import LossSpec, TrainBatch, TrainState, loss_and_grad, train_step

B, L, P_WIDTH = 8, 12, 4
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _init():
    return Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def model_parts():
    # the initialisation jitted (one program instead of one per eager op) without LLVM optimisation (it runs
    # once); the graphdef from its shapes
    graphdef, _ = nnx.split(nnx.eval_shape(_init))
    init = jax.jit(lambda: nnx.split(_init())[1].to_pure_dict(),
                   compiler_options={"xla_backend_optimization_level": 0})
    return graphdef, init()


def _batch(seed: int, *, sft_rows: int = 0) -> TrainBatch:
    """Left-padded prompts of width 4, completions of varied length (one row has none), random logps."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 64, size=(B, L)).astype(np.int32)
    prompt_len = rng.integers(1, P_WIDTH + 1, size=B)
    comp_len = rng.integers(1, L - P_WIDTH + 1, size=B)
    comp_len[3] = 0  # a row with no completion tokens (exercises the seq-mean normaliser)
    pos = np.arange(L)[None, :]
    prompt = (pos < P_WIDTH) & (pos >= P_WIDTH - prompt_len[:, None])
    comp = (pos >= P_WIDTH) & (pos < P_WIDTH + comp_len[:, None])
    tokens = np.where(prompt | comp, tokens, 0)
    old = np.where(comp, -rng.uniform(1.0, 5.0, size=(B, L)), 0.0).astype(np.float32)
    ref = np.where(comp, -rng.uniform(1.0, 5.0, size=(B, L)), 0.0).astype(np.float32)
    adv = np.where(comp, rng.normal(size=(B, 1)), 0.0).astype(np.float32)
    sft = np.zeros((B,), np.float32)
    sft[B - sft_rows:] = 1.0
    c = slice(P_WIDTH, None)  # completion space: everything but the forward's inputs is [B, T]
    return TrainBatch(jnp.asarray(tokens), jnp.asarray(prompt | comp), jnp.asarray(comp[:, c]),
                      jnp.asarray(old[:, c]), jnp.asarray(ref[:, c]), jnp.asarray(adv[:, c]),
                      jnp.full((B,), 0.2, jnp.float32),
                      jnp.full((B,), 0.28, jnp.float32), jnp.asarray(sft))


def _agg_spec(agg: str, grad_accum: int) -> LossSpec:
    # Every loss term on: clipped PG, KL in the loss, entropy bonus, SFT auxiliary (on the last 2 rows).
    return LossSpec(agg=agg, kl_beta=0.1, entropy_coef=0.01, sft_lambda=0.5, grad_accum=grad_accum)


@pytest.fixture(scope="module")
def by_agg(model_parts):
    """{grad_accum: {agg: (loss, grads, metrics)}} for grad_accum 1 and 4 on one batch, each grad_accum's four
    aggregation modes in one jitted program."""
    graphdef, params = model_parts
    batch = _batch(1, sft_rows=2)
    out = {}
    for k in (1, 4):
        fn = jax.jit(lambda p, b, k=k: {a: loss_and_grad(p, graphdef, b, _agg_spec(a, k)) for a in AGGS})
        out[k] = jax.device_get(fn(params, batch))
    return out


@pytest.mark.parametrize("agg", AGGS)
def test_grad_accum_4_equals_full_batch(by_agg, agg):
    loss1, g1, m1 = by_agg[1][agg]
    loss4, g4, m4 = by_agg[4][agg]
    assert np.isfinite(loss1) and abs(loss1) > 1e-3
    np.testing.assert_allclose(loss4, loss1, rtol=1e-5, atol=1e-7)
    for key in ("pg/loss", "kl/loss", "sft/nll"):  # additive terms add up across micro-batches
        np.testing.assert_allclose(m4[key], m1[key], rtol=1e-5, atol=1e-7, err_msg=key)
    leaves1, leaves4 = jax.tree.leaves(g1), jax.tree.leaves(g4)
    assert max(float(np.abs(x).max()) for x in leaves1) > 1e-4  # the gradient is not trivially zero
    for a, b in zip(leaves1, leaves4, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7)


def test_grad_accum_must_divide_batch(model_parts):
    graphdef, params = model_parts
    with pytest.raises(ValueError, match="not divisible by grad_accum=3"):
        loss_and_grad(params, graphdef, _batch(0), LossSpec(grad_accum=3))


# The train step of the ETR and compiler-option tests: SGD (Adam would turn float-rounding differences of
# near-zero gradients into ±lr steps) on a loss with a KL term and an entropy bonus.
TX = optax.sgd(0.1)
STEP_SPEC = LossSpec(kl_beta=0.1, entropy_coef=0.01)


@functools.cache
def _train_step(graphdef, options: tuple[tuple[str, str], ...] | None = None):
    """The jitted train step (one per graphdef and XLA options, so that the tests share its compilation)."""
    return jax.jit(functools.partial(train_step, graphdef=graphdef, spec=STEP_SPEC, tx=TX),
                   compiler_options=None if options is None else dict(options))


def _fresh_state(params) -> TrainState:
    return TrainState(jax.tree.map(jnp.copy, params), TX.init(params), jnp.zeros((), jnp.int32))


def test_etr_with_zero_elasticity_is_grpo_bit_for_bit(model_parts):
    graphdef, params = model_parts
    rng = np.random.default_rng(3)
    rewards_BR = rng.normal(size=(B, 2)).astype(np.float32)
    weights_R = np.asarray([1.0, 0.5], np.float32)
    batch = _batch(2)
    mask_BT = np.asarray(batch.completion_mask_BT)
    spec = AlgoSettings(group_size=4, eps=1e-6, clip_low=0.2, clip_high=0.28, section=AlgorithmConfig(),
                        params=ETRParams(alpha=0.0, beta=0.0, adv_max=3.0))
    grpo = ALGORITHMS["grpo"].advantages(rewards_BR, weights_R, mask_BT, spec)
    etr = ALGORITHMS["etr"].advantages(rewards_BR, weights_R, mask_BT, spec)
    assert np.array_equal(etr.adv_BT, grpo.adv_BT)
    assert np.array_equal(etr.clip_low_B, grpo.clip_low_B)
    assert np.array_equal(etr.clip_high_B, grpo.clip_high_B)
    step = _train_step(graphdef)
    outs = []
    for adv in (grpo, etr):
        b = batch.replace(adv_BT=jnp.asarray(adv.adv_BT), clip_low_B=jnp.asarray(adv.clip_low_B),
                          clip_high_B=jnp.asarray(adv.clip_high_B))
        outs.append(jax.device_get(step(_fresh_state(params), b)))
    (s_grpo, m_grpo), (s_etr, m_etr) = outs
    assert m_grpo["loss"] == m_etr["loss"] and m_grpo["loss"] != 0
    for a, b in zip(jax.tree.leaves(s_grpo.params), jax.tree.leaves(s_etr.params), strict=True):
        assert np.array_equal(a, b)
    moved = zip(jax.tree.leaves(s_grpo.params), jax.tree.leaves(params), strict=True)
    assert any(not np.array_equal(a, b) for a, b in moved)


def test_cpu_update_options_compile_and_keep_the_update(model_parts):
    """The trainer's XLA:CPU options exist in this jaxlib (an unknown option fails to compile) and change
    only how the update runs: same loss, gradient norm and new parameters as the default compilation."""
    from jaxrl.learner.train_step import update_compiler_options

    assert update_compiler_options("tpu") is None and update_compiler_options("gpu") is None
    options = update_compiler_options("cpu")
    assert options
    graphdef, params = model_parts
    outs = []
    for opts in (None, tuple(sorted(options.items()))):
        outs.append(jax.device_get(_train_step(graphdef, opts)(_fresh_state(params), _batch(5))))
    (s0, m0), (s1, m1) = outs
    np.testing.assert_allclose(m1["loss"], m0["loss"], rtol=1e-6)
    np.testing.assert_allclose(m1["train/grad_norm"], m0["train/grad_norm"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s1.params, s0.params)
