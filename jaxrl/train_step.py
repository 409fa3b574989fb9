"""The jitted RL update: one optimiser step over a mini-batch of rollouts, with gradient accumulation.

`train_step(state, batch, graphdef, spec)` is a pure function of arrays (jitted by the caller with donated
state), so the train loop stays a thin functional loop (STYLE.md principle 14):

    loss = policy_loss(logp, old_logp, A, m; eps_low_i, eps_high_i, c)        # jaxrl.losses.policy_loss
         + beta * aggregate(k(logp, ref_logp), m)                             # KL in the loss (optional)
         - lambda_H * aggregate(H, m)                                         # entropy bonus (optional)
         + lambda_SFT * sft_nll(logp*, m*)                                    # AFRL SFT auxiliary (optional)

Gradient accumulation splits the mini-batch into `spec.grad_accum` equal micro-batches and scans over them;
each micro-batch is aggregated with the *full* mini-batch's normaliser (`aggregation_normalizer`), so the
accumulated loss and gradient equal the full-batch ones exactly (up to float summation order).

A step whose loss, gradient or parameter update is not finite is skipped: parameters and optimiser state are
left unchanged and `train/nonfinite` is 1 in the returned metrics (the loop counts consecutive skips and stops
the run).

Deviations from verl/TRL: token log-probs are computed from final hidden states in vocabulary chunks in
float32 (`jaxrl.losses.token_logprobs_and_entropy`), never from a materialised [B, L, V] logits tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl import losses


@flax.struct.dataclass
class TrainState:
    """Everything the update changes: parameters (pure dict), optax state, step counter."""

    params: Any
    opt_state: Any
    step: jax.Array


@flax.struct.dataclass
class TrainBatch:
    """A mini-batch of full sequences (prompt, left-padded, then completion, right-padded), length L.

    Per-token arrays are aligned with `tokens_BL`: `old_logp_BL[b, t]` is the log-prob of token t. The loss
    uses positions 1..L-1 as targets, predicted from hidden states 0..L-2.
    """

    tokens_BL: jax.Array  # int32
    mask_BL: jax.Array  # bool, real (non-pad) tokens
    loss_mask_BL: jax.Array  # bool, completion tokens that are trained on (incl. EOS)
    old_logp_BL: jax.Array  # float32, behaviour-policy log-probs of completion tokens
    ref_logp_BL: jax.Array  # float32, reference-policy log-probs (zeros when no KL)
    adv_BL: jax.Array  # float32 per-token advantages (aligned with tokens; 0 off the completion)
    clip_low_B: jax.Array  # float32 per-sequence lower clip bounds (ETR; constant otherwise)
    clip_high_B: jax.Array  # float32 per-sequence upper clip bounds
    sft_weight_B: jax.Array  # float32, 1 for expert (SFT-aux) rows, 0 for rollout rows


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """Static settings of the update (hashable: a jit static argument)."""

    agg: str = "token-mean"
    dual_clip: float | None = None
    ratio_level: str = "token"
    kl_beta: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0
    sft_lambda: float = 0.0
    policy_weight: float = 1.0  # 0 turns the step into pure SFT (warm start)
    grad_accum: int = 1
    logprob_chunk: int = 8192
    temperature: float = 1.0


def _shifted(batch: TrainBatch):
    """Targets and masks for next-token prediction: positions 1..L-1."""
    return (
        batch.tokens_BL[:, 1:],
        batch.loss_mask_BL[:, 1:],
        batch.old_logp_BL[:, 1:],
        batch.ref_logp_BL[:, 1:],
        batch.adv_BL[:, 1:],
    )


def token_logprobs(model: nnx.Module, tokens_BL, mask_BL, *, chunk: int, temperature: float = 1.0):
    """(logp_BT, entropy_BT, hidden_BLD): log-probs of tokens 1..L-1 given their prefixes, chunked over V."""
    out = model.forward(tokens_BL, None, mask_BL, return_hidden=True, return_logits=False)
    logp_BT, ent_BT = losses.token_logprobs_and_entropy(
        out.hidden[:, :-1], model.unembedding(), tokens_BL[:, 1:], chunk_size=chunk, temperature=temperature
    )
    return logp_BT, ent_BT, out.hidden


def _loss(params, graphdef, batch: TrainBatch, spec: LossSpec, norm):
    model = nnx.merge(graphdef, params)
    logp_BT, ent_BT, _ = token_logprobs(
        model, batch.tokens_BL, batch.mask_BL, chunk=spec.logprob_chunk, temperature=spec.temperature
    )
    _, m_BT, old_BT, ref_BT, adv_BT = _shifted(batch)
    rl_m_BT = m_BT & (batch.sft_weight_B[:, None] == 0)
    pg, metrics = losses.policy_loss(
        logp_BT, old_BT, adv_BT, rl_m_BT, clip_low=batch.clip_low_B, clip_high=batch.clip_high_B,
        dual_clip=spec.dual_clip, agg=spec.agg, ratio_level=spec.ratio_level, normalizer=norm["rl"],
    )
    loss = spec.policy_weight * pg
    if spec.kl_beta > 0:
        kl_BT = losses.kl_penalty(logp_BT, ref_BT, spec.kl_kind)
        kl = losses.aggregate(kl_BT, rl_m_BT, spec.agg, normalizer=norm["rl"])
        loss = loss + spec.kl_beta * kl
        metrics["kl/loss"] = kl
    ent_term, ent_metrics = losses.entropy_bonus(ent_BT, rl_m_BT, coef=spec.entropy_coef, agg=spec.agg,
                                                 normalizer=norm["rl"])
    metrics.update(ent_metrics)
    loss = loss + ent_term
    if spec.sft_lambda > 0:
        sft_m_BT = m_BT & (batch.sft_weight_B[:, None] > 0)
        # token-mean NLL over the expert rows of the whole mini-batch (global token count in norm["sft"])
        sft = -jnp.sum(jnp.where(sft_m_BT, logp_BT, 0.0)) / norm["sft"]
        loss = loss + spec.sft_lambda * sft
        metrics["sft/nll"] = sft
    metrics["loss"] = loss
    return loss, metrics


def normalizers(batch: TrainBatch, spec: LossSpec) -> dict[str, jax.Array]:
    """Global aggregation normalisers of a whole mini-batch (shared by its micro-batches)."""
    _, m_BT, _, _, _ = _shifted(batch)
    rl_m_BT = m_BT & (batch.sft_weight_B[:, None] == 0)
    sft_m_BT = m_BT & (batch.sft_weight_B[:, None] > 0)
    return {
        "rl": losses.aggregation_normalizer(rl_m_BT, spec.agg),
        "sft": jnp.maximum(jnp.sum(sft_m_BT).astype(jnp.float32), 1.0),
    }


def loss_and_grad(params, graphdef, batch: TrainBatch, spec: LossSpec):
    """Accumulated (loss, grads, metrics) over `spec.grad_accum` micro-batches with global normalisers."""
    norm = normalizers(batch, spec)
    grad_fn = jax.value_and_grad(_loss, has_aux=True)
    if spec.grad_accum == 1:
        (loss, metrics), grads = grad_fn(params, graphdef, batch, spec, norm)
        return loss, grads, metrics
    b = batch.tokens_BL.shape[0]
    if b % spec.grad_accum:
        raise ValueError(f"mini-batch of {b} rows is not divisible by grad_accum={spec.grad_accum}")
    micro = jax.tree.map(lambda x: x.reshape(spec.grad_accum, b // spec.grad_accum, *x.shape[1:]), batch)

    def body(carry, mb):
        (loss, metrics), grads = grad_fn(params, graphdef, mb, spec, norm)
        acc_loss, acc_grads = carry
        return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads)), metrics

    zeros = jax.tree.map(jnp.zeros_like, params)
    (loss, grads), metrics_M = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro)
    # Loss terms add up across micro-batches; ratio-style metrics are averaged.
    metrics = {k: (jnp.sum(v) if k in _ADDITIVE else jnp.mean(v)) for k, v in metrics_M.items()}
    metrics["loss"] = loss
    return loss, grads, metrics


_ADDITIVE = frozenset({"loss", "pg/loss", "kl/loss", "entropy/loss", "sft/nll"})


def train_step(state: TrainState, batch: TrainBatch, graphdef, spec: LossSpec,
               tx: optax.GradientTransformation):
    """One optimiser update; skips (and flags) the update when the loss or gradients are not finite."""
    chex.assert_rank(batch.tokens_BL, 2)
    loss, grads, metrics = loss_and_grad(state.params, graphdef, batch, spec)
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
    metrics["train/grad_norm"] = grad_norm
    metrics["train/nonfinite"] = (~finite).astype(jnp.int32)
    return new_state, metrics


# XLA:CPU: let YNNPACK fuse each dot with its elementwise neighbours (the default calls the library for the
# bare dot). The weight-gradient dots then read their token-major operands through the fusion instead of
# after a separate transposing elementwise pass: 13% faster update of the benchmark model on a 2-core CPU.
# The sampler keeps the default, under which decode measured faster (benchmarks/RESULTS.md).
_CPU_UPDATE_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}


def update_compiler_options(backend: str | None = None) -> dict[str, str] | None:
    """`compiler_options` for `jax.jit` of `train_step` on `backend` (default: JAX's default backend)."""
    backend = jax.default_backend() if backend is None else backend
    return dict(_CPU_UPDATE_OPTIONS) if backend == "cpu" else None


def sequence_logprobs(params, graphdef, tokens_BL, mask_BL, *, chunk: int, temperature: float = 1.0):
    """Per-token log-probs aligned with `tokens_BL` (position 0 gets 0), for old / reference log-probs."""
    model = nnx.merge(graphdef, params)
    logp_BT, _, _ = token_logprobs(model, tokens_BL, mask_BL, chunk=chunk, temperature=temperature)
    return jnp.pad(logp_BT, ((0, 0), (1, 0)))
