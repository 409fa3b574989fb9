"""The jitted RL update: one optimiser step over a mini-batch of rollouts, with gradient accumulation.

`train_step(state, batch, base, *, graphdef, spec, tx)` is a pure function of arrays (jitted by the caller with donated
state), so the train loop stays a thin functional loop (STYLE.md principle 14):

    l_BT = clipped_objective(logp, old_logp, A, m; eps_low_i, eps_high_i, c)   # jaxrl.losses, per token
         + beta * kl_penalty(logp, ref_logp)                                   # KL in the loss (optional)
         - lambda_H * H                                                        # entropy bonus (optional)
    loss = aggregate(l_BT, m, agg) + lambda_SFT * sft_nll(logp*, m*)          # aggregated once

Gradient accumulation splits the mini-batch into `spec.grad_accum` equal micro-batches and scans over them;
each micro-batch is aggregated with the *full* mini-batch's normaliser (`aggregation_normalizer`), so the
accumulated loss and gradient equal the full-batch ones exactly (up to float summation order).

A step whose loss, gradient or parameter update is not finite is skipped: parameters and optimiser state are
left unchanged and `train/nonfinite` is 1 in the returned metrics (the loop counts consecutive skips and stops
the run).

Deviations from verl/TRL: token log-probs are computed from final hidden states in vocabulary chunks in
float32 (`jaxrl.losses.token_logprobs_and_entropy`), never from a materialised [B, L, V] logits tensor, and
only at the T completion positions (the batch is in completion space, `TrainBatch`). A batch of GRPO groups
(`TrainBatch.group` = G) runs each prompt through the layers once for its G completions
(`Transformer.forward_groups`): the same numbers up to summation order, 0.56x the per-token work at W = T,
G = 8 (TRL and verl recompute the prompt G times; benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl import losses
from jaxrl.learner.cpu_compile import YNN_DOT, cpu_jit
from jaxrl.learner.objectives import OBJECTIVES
from jaxrl.learner.packed import packed_token_logprobs
from jaxrl.models import lora
from jaxrl.runtime import compile_cache

# Sharded XLA:CPU updates and log-prob passes (layer scans) stay out of the persistent compilation cache: a
# cached one can deadlock in its collectives (`jaxrl.runtime.compile_cache`).
compile_cache.install()


@flax.struct.dataclass
class TrainState:
    """Everything the update changes: parameters (pure dict), optax state, step counter."""

    params: Any
    opt_state: Any
    step: jax.Array


@flax.struct.dataclass
class TrainBatch:
    """A mini-batch in completion space: full sequences for the forward pass, everything else `[B, T]`.

    `tokens_BL` is [left-padded prompt (width W) | completion (width T)], L = W + T. The loss reads only the
    completion positions: `completion_mask_BT[b, t]` marks token `tokens_BL[b, W + t]` as trained on, and
    `old_logp_BT`, `ref_logp_BT`, `adv_BT` are aligned with those tokens. The forward pass projects only the
    hidden states that predict them (positions W-1 .. L-2) onto the vocabulary.

    `group` (static): G > 1 says that the rows come in groups of G consecutive rows with identical prompt
    columns (`tokens_BL[:, :W]` where `mask_BL`; a GRPO group); the forward then runs each prompt once per
    group (`Transformer.forward_groups`, equal to the unshared forward up to summation order). 1: no such
    structure.
    Whoever builds or reorders the rows keeps groups whole (`jaxrl.rl.batch.assemble`, `update`).
    """

    tokens_BL: jax.Array  # int32
    mask_BL: jax.Array  # bool, real (non-pad) tokens
    completion_mask_BT: jax.Array  # bool, completion tokens that are trained on (incl. EOS)
    old_logp_BT: jax.Array  # float32, behaviour-policy log-probs of completion tokens
    ref_logp_BT: jax.Array  # float32, reference-policy log-probs (zeros when no KL)
    adv_BT: jax.Array  # float32 per-token advantages (0 off the completion)
    clip_low_B: jax.Array  # float32 per-sequence lower clip bounds (ETR; constant otherwise)
    clip_high_B: jax.Array  # float32 per-sequence upper clip bounds
    sft_weight_B: jax.Array  # float32, 1 for expert (SFT-aux) rows, 0 for rollout rows
    is_weight_BT: Any = None  # float32 train/sampler importance weights (TIS / MIS), None = no correction
    group: int = flax.struct.field(pytree_node=False, default=1)  # rows per shared-prompt group (1: none)
    # float32 on-policy distillation teacher's log-probs (`jaxrl.rl.distill`, reverse_kl_loss), None = none;
    # after `group`, so the positional form (..., is_weight_BT, group) keeps its meaning
    teacher_logp_BT: Any = None
    # int32 [B, L] segment ids of packed rows (`jaxrl.rl.packing`: several sequences per row, each attending only
    # to itself, positions restarting per segment), None = one sequence per row
    segment_BL: Any = None
    # `jaxrl.learner.packed.PackedRows`: the forward runs over these packed rows and gathers each completion
    # token's log-prob back to [B, T] (`jaxrl.rl.packing.rl_layout`); None = the padded rows' forward
    packed: Any = None


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """Static settings of the update (hashable: a jit static argument)."""

    agg: losses.AggMode = losses.AggMode.TOKEN_MEAN
    dual_clip: float | None = None
    ratio_level: str = "token"
    kl_beta: float = 0.0
    kl_kind: losses.KLKind = losses.KLKind.K3
    entropy_coef: float = 0.0
    sft_lambda: float = 0.0
    policy_weight: float = 1.0  # 0 turns the step into pure SFT (warm start)
    grad_accum: int = 1
    logprob_chunk: int = 8192
    temperature: float = 1.0
    objective: str = "ppo_clip"  # a key of `jaxrl.learner.objectives.OBJECTIVES`
    objective_kwargs: tuple[tuple[str, Any], ...] = ()  # that objective's settings (hashable)
    lora: Any = None  # `jaxrl.models.lora.LoraConfig`: the trained params are adapters over a frozen `base`
    distill_coef: float = 0.0  # on-policy distillation as a loss term (`algorithm.distill`, reverse_kl_loss)
    distill_kind: losses.KLKind = losses.KLKind.K2


def full_params(params, base, lora_cfg):
    """The model's parameters: `params` itself, or W + s·A·B over the frozen (maybe quantised) `base` when
    `params` are LoRA adapters (`jaxrl.models.lora.merge`; only the adapters get gradients)."""
    if lora_cfg is None:
        return params
    return lora.merge(jax.lax.stop_gradient(base), params, lora_cfg)


def token_logprobs(model: nnx.Module, tokens_BL, mask_BL, width: int, *, chunk: int, temperature: float = 1.0,
                   group: int = 1, segment_BL=None):
    """(logp_BT, entropy_BT, hidden_BTD) of the last `width` tokens given their prefixes, chunked over V.

    Only the T = `width` hidden states that predict those tokens (`hidden_BTD`, positions W-1 .. L-2) are
    projected onto the vocabulary. `group` > 1: rows come in groups of `group` with identical prompt columns
    (`TrainBatch.group`), and each group's prompt runs through the layers once (`Transformer.forward_groups`).
    `segment_BL`: packed rows (`TrainBatch.segment_BL`).
    """
    b, length = tokens_BL.shape
    w = length - width
    if group > 1:
        if segment_BL is not None:
            raise ValueError("packed rows (segment_BL) have no shared-prompt groups")
        if b % group:
            raise ValueError(f"{b} rows do not split into prompt groups of {group}")
        first_PW = lambda x_BW: x_BW.reshape(b // group, group, w)[:, 0]
        hidden_BTD = model.forward_groups(first_PW(tokens_BL[:, :w]), first_PW(mask_BL[:, :w]),
                                          tokens_BL[:, w:], mask_BL[:, w:])
    else:
        out = model.forward(tokens_BL, None, mask_BL, return_hidden=True, return_logits=False,
                            segment_BL=segment_BL)
        hidden_BTD = out.hidden[:, w - 1:length - 1]
    logp_BT, ent_BT = losses.token_logprobs_and_entropy(
        hidden_BTD, model.unembedding(), tokens_BL[:, w:], chunk_size=chunk, temperature=temperature
    )
    return logp_BT, ent_BT, hidden_BTD


def _masks(batch: TrainBatch):
    """(rl_m_BT, sft_m_BT): completion tokens of rollout rows and of expert (SFT) rows."""
    m_BT = batch.completion_mask_BT
    expert_B1 = batch.sft_weight_B[:, None] > 0
    return m_BT & ~expert_B1, m_BT & expert_B1


def _loss(params, graphdef, batch: TrainBatch, spec: LossSpec, norm, base=None):
    """The step's loss: per-token terms summed, aggregated once with the mini-batch's normalisers.

        l_BT = w_IS·l_pg + β·k(logp, ref_logp) + c·k'(logp, teacher_logp) − λ_H·H
               (rollout rows; l_pg from OBJECTIVES[spec.objective].fn; c: on-policy distillation's loss mode)
        loss = w_pg·aggregate(l, m, agg) + λ_SFT·sft_nll(logp*, m*)
    """
    model = nnx.merge(graphdef, full_params(params, base, spec.lora))
    width = batch.completion_mask_BT.shape[1]
    if batch.packed is not None:  # the same [B, T] log-probs from the packed rows' forward
        logp_BT, ent_BT = packed_token_logprobs(model, batch.packed, chunk=spec.logprob_chunk,
                                                temperature=spec.temperature)
    else:
        logp_BT, ent_BT, _ = token_logprobs(model, batch.tokens_BL, batch.mask_BL, width,
                                            chunk=spec.logprob_chunk, temperature=spec.temperature,
                                            group=batch.group, segment_BL=batch.segment_BL)
    rl_m_BT, sft_m_BT = _masks(batch)
    agg = lambda v_BT: losses.aggregate(v_BT, rl_m_BT, spec.agg, normalizer=norm["rl"])
    pg_BT, metrics = OBJECTIVES[spec.objective].fn(logp_BT, batch, rl_m_BT, spec, **dict(spec.objective_kwargs))
    if batch.is_weight_BT is not None:  # train-inference mismatch correction (constant weights)
        pg_BT = pg_BT * jax.lax.stop_gradient(batch.is_weight_BT)
    total_BT = spec.policy_weight * pg_BT
    metrics["pg/loss"] = jax.lax.stop_gradient(agg(pg_BT))
    if spec.kl_beta > 0:
        kl_BT = losses.kl_penalty(logp_BT, batch.ref_logp_BT, spec.kl_kind)
        total_BT = total_BT + spec.kl_beta * kl_BT
        metrics["kl/loss"] = jax.lax.stop_gradient(agg(kl_BT))
    if spec.distill_coef > 0:  # reverse KL to the teacher on the student's samples (`jaxrl.rl.distill`)
        distill_BT = losses.kl_penalty(logp_BT, batch.teacher_logp_BT, spec.distill_kind)
        total_BT = total_BT + spec.distill_coef * distill_BT
        metrics["distill/loss"] = jax.lax.stop_gradient(agg(distill_BT))
    if spec.entropy_coef > 0:
        total_BT = total_BT - spec.entropy_coef * ent_BT
    entropy = jax.lax.stop_gradient(agg(ent_BT))
    metrics["entropy/mean"] = losses.masked_mean(jax.lax.stop_gradient(ent_BT), rl_m_BT)
    metrics["entropy/loss"] = -spec.entropy_coef * entropy
    loss = agg(total_BT)
    if spec.sft_lambda > 0:
        sft = losses.sft_nll(logp_BT, sft_m_BT, normalizer=norm["sft"])
        loss = loss + spec.sft_lambda * sft
        metrics["sft/nll"] = jax.lax.stop_gradient(sft)
    metrics["loss"] = loss
    return loss, metrics


def normalizers(batch: TrainBatch, spec: LossSpec) -> dict[str, jax.Array]:
    """Global aggregation normalisers of a whole mini-batch (shared by its micro-batches)."""
    rl_m_BT, sft_m_BT = _masks(batch)
    return {
        "rl": losses.aggregation_normalizer(rl_m_BT, spec.agg),
        "sft": jnp.maximum(jnp.sum(sft_m_BT).astype(jnp.float32), 1.0),
    }


def loss_and_grad(params, graphdef, batch: TrainBatch, spec: LossSpec, base=None):
    """Accumulated (loss, grads, metrics) over `spec.grad_accum` micro-batches with global normalisers
    (`base`: the frozen model under LoRA adapters `params`, see `full_params`)."""
    norm = normalizers(batch, spec)
    grad_fn = jax.value_and_grad(_loss, has_aux=True)
    b, k = batch.tokens_BL.shape[0], spec.grad_accum
    if k > 1 and b % k == 0 and (b // k) % batch.group:
        raise ValueError(f"grad_accum={k} micro-batches of {b // k} rows split the prompt groups of "
                         f"{batch.group} rows (assemble the batch with group=1)")
    loss, grads, metrics = accumulate(lambda p, mb: grad_fn(p, graphdef, mb, spec, norm, base), params, batch,
                                      spec.grad_accum, additive=_ADDITIVE)
    return loss, grads, {**metrics, "loss": loss}


def accumulate(grad_fn, params, batch, grad_accum: int, *, additive=frozenset()):
    """(loss, grads, metrics) of `grad_fn(params, micro) -> ((loss, metrics), grads)` summed over `grad_accum`
    equal micro-batches of `batch` (a scan over its leading dimension). Each micro-batch's loss must be
    aggregated with the whole batch's normaliser, so that the sums are the full batch's loss and gradient;
    `additive` metrics (loss terms) add up, the others (ratios) are averaged."""
    if grad_accum == 1:
        (loss, metrics), grads = grad_fn(params, batch)
        return loss, grads, metrics
    for x in jax.tree.leaves(batch):  # rows, or packed rows (`PackedRows`): each split into grad_accum parts
        if x.shape[0] % grad_accum:
            raise ValueError(f"mini-batch of {x.shape[0]} rows is not divisible by grad_accum={grad_accum}")
    micro = jax.tree.map(lambda x: x.reshape(grad_accum, x.shape[0] // grad_accum, *x.shape[1:]), batch)

    def body(carry, mb):
        (loss, metrics), grads = grad_fn(params, mb)
        acc_loss, acc_grads = carry
        return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads)), metrics

    zeros = jax.tree.map(jnp.zeros_like, params)
    (loss, grads), metrics_M = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro)
    metrics = {k: (jnp.sum(v) if k in additive else jnp.mean(v)) for k, v in metrics_M.items()}
    return loss, grads, metrics


_ADDITIVE = frozenset({"loss", "pg/loss", "kl/loss", "distill/loss", "entropy/loss", "sft/nll"})


def train_step(state: TrainState, batch: TrainBatch, base=None, *, graphdef, spec: LossSpec,
               tx: optax.GradientTransformation):
    """One optimiser update; skips (and flags) the update when the loss or gradients are not finite.

    Under LoRA (`spec.lora`), `state.params` are the adapters and `base` the frozen model they sit on."""
    chex.assert_rank(batch.tokens_BL, 2)
    loss, grads, metrics = loss_and_grad(state.params, graphdef, batch, spec, base)
    new_state, guard = apply_if_finite(state, loss, grads, tx)
    return new_state, {**metrics, **guard}


def apply_if_finite(state: TrainState, loss, grads, tx: optax.GradientTransformation):
    """(state after one optimiser update, {"train/grad_norm", "train/nonfinite"}); the update is skipped
    (parameters and optimiser state kept, the step counted) when the loss, the gradient or the update is not
    finite."""
    grad_norm = optax.global_norm(grads)
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    # Finite gradients can still give non-finite updates (an infinite learning rate, an overflowing second
    # moment); such an update would poison the parameters for good, so it is skipped as well.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(updates))
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = TrainState(
        params=keep(new_params, state.params), opt_state=keep(new_opt, state.opt_state), step=state.step + 1
    )
    return new_state, {"train/grad_norm": grad_norm, "train/nonfinite": (~finite).astype(jnp.int32)}


def update_compiler_options(backend: str | None = None) -> dict[str, str] | None:
    """The XLA:CPU `compiler_options` the update compiles with (`backend`, default JAX's; None elsewhere):
    YNNPACK fuses each dot with its elementwise neighbours (the default calls the library for the bare dot),
    so the weight-gradient dots read their token-major operands through the fusion instead of after a separate
    transposing pass, 13% faster on a 2-core CPU; `cpu_compile.cpu_jit` guards it. Decode programs compile
    without YNNPACK (`jaxrl.sampling.engine.CPU_DECODE_OPTIONS`: its few-row dots)."""
    backend = jax.default_backend() if backend is None else backend
    return dict(YNN_DOT) if backend == "cpu" else None


def sequence_logprobs(params, graphdef, tokens_BL, mask_BL, width: int, *, chunk: int,
                      temperature: float = 1.0, group: int = 1):
    """Log-probs [B, T] of the last T = `width` tokens of each row (the completion), for old / reference
    log-probs (`group`: shared-prompt groups, as `token_logprobs`). Quantised kernels (a QLoRA base) are
    dequantised inside the computation, not kept."""
    model = nnx.merge(graphdef, dequantized(params))
    logp_BT, _, _ = token_logprobs(model, tokens_BL, mask_BL, width, chunk=chunk, temperature=temperature,
                                   group=group)
    return logp_BT


def dequantized(params):
    """`params` with every `jaxrl.models.quant.QuantizedKernel` leaf dequantised (a no-op otherwise)."""
    from jaxrl.models import quant

    is_q = lambda x: isinstance(x, quant.QuantizedKernel)
    return jax.tree.map(lambda x: quant.dequantize(x) if is_q(x) else x, params, is_leaf=is_q)


def jitted_train_step(graphdef, spec: LossSpec, tx, state_sharding):
    """The jitted update `(state, batch, base) -> (state, metrics)` the run executes (and `jaxrl plan
    --compile` lowers from abstract inputs): the state donated and kept in `state_sharding`; on CPU with
    YNNPACK's dot fusion where it is safe (`cpu_compile.cpu_jit`)."""
    return cpu_jit(functools.partial(train_step, graphdef=graphdef, spec=spec, tx=tx), fast=YNN_DOT,
                   in_shardings=(state_sharding, None, None), out_shardings=(state_sharding, None),
                   donate_argnums=0)


def jitted_logprob_pass(graphdef, spec: LossSpec):
    """The jitted old/reference log-prob pass `(params, tokens_BL, mask_BL, width, group) -> logp_BT` (on CPU
    with XLA's default YNNPACK fusions where they are safe)."""
    def logprobs(params, tokens_BL, mask_BL, width, group):
        return sequence_logprobs(params, graphdef, tokens_BL, mask_BL, width, chunk=spec.logprob_chunk,
                                 temperature=spec.temperature, group=group)

    return cpu_jit(logprobs, fast=None, static_argnums=(3, 4))


def jitted_packed_logprob_pass(graphdef, spec: LossSpec):
    """The jitted old/reference log-prob pass over packed rows `(params, packed) -> logp_BT`
    (`jaxrl.learner.packed`: the padded pass's [B, T] log-probs up to summation order)."""
    def logprobs(params, packed):
        model = nnx.merge(graphdef, dequantized(params))
        return packed_token_logprobs(model, packed, chunk=spec.logprob_chunk, temperature=spec.temperature)[0]

    return cpu_jit(logprobs, fast=None)
