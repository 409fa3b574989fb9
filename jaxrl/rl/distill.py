"""On-policy distillation (`algorithm.distill`): a frozen teacher scores the tokens the student sampled.

The student samples as in RL; the teacher's log-probs of those tokens, log π_T(y_t | y_<t), give the per-token
reverse KL on the student's own samples,

    d_t = log π_old(y_t | y_<t) − log π_T(y_t | y_<t)          (a one-sample estimate of KL(π ‖ π_T) at t)

and the student is trained to make it small, either

* `mode: reward` (Thinking Machines' on-policy distillation, tinker-cookbook `incorporate_kl_penalty`): the
  negative reverse KL is a dense per-token reward added to the advantages after the estimator's own
  normalisation, A_t ← A_t − coef · Σ_{k≥t} γ^{k−t} d_k (γ = `discount`, 0 by default: A_t − coef · d_t); or
* `mode: reverse_kl_loss` (Agarwal et al., GKD, arXiv:2306.13649, with λ = 1: on-policy student samples and
  the reverse KL): a term coef · k(log π_θ, log π_T) of the loss (`jaxrl.learner.train_step`), k2 by default, whose
  gradient on the student's own samples is the reverse KL's: E_π[(log π_θ − log π_T) ∇log π_θ] = ∇KL(π_θ ‖ π_T)
  (the +1 of the exact gradient has expectation 0); k3 there would follow the forward KL's gradient.

Task rewards still give the estimator's advantages (mixed); with every task reward's weight 0 the teacher is
the only signal. The teacher is any checkpoint `jaxrl.io.model_io.load_model` reads (run or checkpoint
directory, HF safetensors directory) whose tokenizer is the student's (checked at setup), sharded on the
run's mesh like the policy; its log-probs are taken at temperature 1 (its own distribution).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.io import model_io
from jaxrl.runtime import step_time
from jaxrl.errors import CheckpointError, ConfigError
from jaxrl.runtime.run_checks import check_teacher
from jaxrl.sharding import hosts, state_shardings
from jaxrl.learner.train_step import LossSpec, TrainBatch, jitted_logprob_pass

_KEY = "algorithm.distill.teacher"  # the config key errors name


def discounted_future_sum_BT(x_BT: jax.Array, discount: float) -> jax.Array:
    """y_t = Σ_{k≥t} γ^{k−t} x_k along T (γ = 0: x itself), by a reverse scan."""
    chex.assert_rank(x_BT, 2)
    if discount == 0:
        return x_BT

    def body(carry_B, x_B):
        y_B = x_B + discount * carry_B
        return y_B, y_B

    _, y_TB = jax.lax.scan(body, jnp.zeros(x_BT.shape[:1], x_BT.dtype), x_BT.T, reverse=True)
    return y_TB.T


@functools.partial(jax.jit, static_argnames=("coef", "discount"))
def distill_advantages_BT(adv_BT, old_logp_BT, teacher_logp_BT, mask_BT, *, coef: float, discount: float):
    """A_t − coef · Σ_{k≥t} γ^{k−t} d_k on the trained tokens (d_t = old − teacher log-prob, 0 off the mask)."""
    chex.assert_equal_shape([adv_BT, old_logp_BT, teacher_logp_BT, mask_BT])
    d_BT = jnp.where(mask_BT, old_logp_BT - teacher_logp_BT, 0.0)
    return adv_BT - coef * jnp.where(mask_BT, discounted_future_sum_BT(d_BT, discount), 0.0)


@jax.jit
def reverse_kl_stats(old_logp_BT, teacher_logp_BT, mask_BT) -> dict[str, jax.Array]:
    """The mean per-token reverse KL estimate d_t over the trained tokens (tinker-cookbook's `teacher_kl`)."""
    m_BT = mask_BT.astype(jnp.float32)
    d_BT = (old_logp_BT - teacher_logp_BT) * m_BT
    return {"distill/reverse_kl": jnp.sum(d_BT) / jnp.maximum(jnp.sum(m_BT), 1.0)}


class Teacher:
    """The batch stage of distillation: the teacher's log-probs of the batch's tokens, then (mode reward)
    the advantages or (mode reverse_kl_loss) `TrainBatch.teacher_logp_BT` for the loss term."""

    def __init__(self, graphdef, params, *, mode: str, coef: float, discount: float, path: str):
        self.graphdef, self.params, self.path = graphdef, params, path
        self.mode, self.coef, self.discount = mode, coef, discount
        spec = LossSpec(temperature=1.0)
        self._logprobs = jitted_logprob_pass(graphdef, spec)

    def __call__(self, batch: TrainBatch, clock: step_time.StageClock) -> tuple[TrainBatch, dict[str, float]]:
        width = batch.completion_mask_BT.shape[1]
        with clock("teacher_logprobs"):
            teacher_BT = step_time.synced(self._logprobs(self.params, batch.tokens_BL, batch.mask_BL, width,
                                                         batch.group))
        rollout_BT = batch.completion_mask_BT & (batch.sft_weight_B[:, None] == 0)  # not expert rows
        metrics = {k: float(v) for k, v in
                   jax.device_get(reverse_kl_stats(batch.old_logp_BT, teacher_BT, rollout_BT)).items()}
        if self.mode == "reward":
            adv_BT = distill_advantages_BT(batch.adv_BT, batch.old_logp_BT, teacher_BT, rollout_BT,
                                           coef=self.coef, discount=self.discount)
            return batch.replace(adv_BT=adv_BT), metrics
        return batch.replace(teacher_logp_BT=teacher_BT), metrics


def load_teacher(path: str, tokenizer, mesh, rules, *, mode: str, coef: float, discount: float) -> Teacher:
    """The teacher at `path`, its parameters on `mesh`; a teacher whose vocabulary or tokenizer is not the
    student's is a ConfigError (one line), before anything compiles."""
    where = check_teacher(path, tokenizer)  # also `jaxrl train`'s check before the run directory is touched
    try:
        model, _ = model_io.load_model(where)
    except (OSError, ValueError, CheckpointError) as e:
        raise ConfigError(f"{_KEY}={path!r}: cannot load a model there: {str(e).splitlines()[0]}") from None
    graphdef, state = nnx.split(model)
    params = hosts.place_global(state.to_pure_dict(), state_shardings(state, mesh, rules).to_pure_dict())
    return Teacher(graphdef, params, mode=mode, coef=coef, discount=discount, path=str(where))
