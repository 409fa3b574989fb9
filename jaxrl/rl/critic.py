"""PPO's critic (`algorithm.name: ppo`): a value model next to the policy, GAE advantages from its values, and
its own update.

    V_BT  = w · h(x)[W − 1 + t]                         the value of the state before completion token t
    A, R  = GAE_γλ(r_BT, V_BT, m_BT)                    `losses.gae_advantages` (r: the reward at the last token)
    A     ← whiten_m(A)                                 over the batch's trained tokens (`algorithm.ppo.whiten`)
    L_V   = ½ agg_m(max((V − R)², (clip(V, V_old ± c) − R)²))       `losses.value_loss`

(Schulman et al., "High-Dimensional Continuous Control Using GAE", arXiv:1506.02438, and "Proximal Policy
Optimization Algorithms", arXiv:1707.06347; reference: verl `compute_gae_advantage_return`,
`compute_value_loss` and `dp_critic`.) The value model is a `jaxrl.reward_model.RewardModel` (the trunk and a
[D, 1] head, no LM head) read at every completion position: the hidden states W − 1 .. L − 2 that the
policy's log-probs read (verl's critic: a one-label token-classification head, values[:, -T-1:-1]). It
starts from the model RL starts from, after the SFT warm start, with a fresh head (`critic_init: policy`), or
from a model or reward model at a path, or is LoRA adapters of its own over a LoRA policy's frozen base
(`jaxrl.rl.value_model`), and it trains with its own AdamW, the run's PPO
epochs x mini-batches x micro-batches (its own row order) and the value clip; its parameters and optimiser
state are checkpointed with the policy's (the checkpoint's `critic` item), so a resumed run continues exactly.

`ActorCritic` is the `UpdateSchedule` of an algorithm with a critic (`Algorithm.critic`): the estimator gives
the per-token rewards (`estimators.outcome_rewards`), the critic's values turn them into advantages, the inner
schedule updates the policy with them (not during the critic's warm-up), and the critic takes its steps on
the same rows with the values it gave as V_old (verl's order: critic, then actor; neither reads the other's
update, so the order does not change a number).

Choices: the critic runs its own forward (no shared-prompt groups); a KL penalty in the reward is −β·kl_t on
each completion token t (verl's `apply_kl_penalty`; `algorithm.kl.where: reward`). TRL's
experimental `PPOTrainer` differs from verl (and so from this) in three ways: one optimiser steps
pg_loss + vf_coef · vf_loss of a policy-and-value wrapper (here and in verl the critic has its own); its value
loss and clip fraction also count the position after the last response token (`padding_mask_p1`); and each
micro-batch's losses are means over that micro-batch (here, as for the policy, every micro-batch divides by
the whole mini-batch's token count, so accumulation equals the full batch).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from jaxrl import losses
from jaxrl.rl.batch import minibatch_rows, minibatch_steps, pad_rows, row_multiple, shard_batch
from jaxrl.rl.update import Updated
from jaxrl.rl.value_model import Critic, CriticSpec, ValueBatch, make_critic, token_values_BT
from jaxrl.runtime import step_time
from jaxrl.sharding import hosts

__all__ = ["ActorCritic", "Critic", "CriticSpec", "ValueBatch", "gae_BT", "make_critic", "token_values_BT"]


@functools.partial(jax.jit, static_argnames=("gamma", "lam", "whiten"))
def gae_BT(rewards_BT, values_BT, mask_BT, *, gamma: float, lam: float, whiten: bool):
    """(advantages, returns) of GAE(γ, λ), the advantages whitened over the trained tokens (`whiten`)."""
    return losses.gae_advantages(rewards_BT, values_BT, mask_BT, gamma=gamma, lam=lam, whiten=whiten)


@dataclasses.dataclass
class ActorCritic:
    """The `UpdateSchedule` of PPO with a critic: values -> GAE advantages -> the inner schedule's policy
    update (frozen for the first `spec.warmup_steps` steps) -> the critic's own steps. Metrics: the inner
    schedule's, `critic/*` (value loss, clip fraction, mean prediction, gradient norm; `critic/values_mean`,
    `critic/returns_mean`, `critic/vf_explained_var` of the rollout) and `train/nonfinite` over both.

    token_rewards: per-token reward terms added to the estimator's (`ro -> (r_BT, metrics)`; the KL penalty
    in the reward, `KLRewardPenalty.token_rewards`). A multi-agent rollout's rows (the trained roles', not
    prompts x G) are padded to the batch shards x mini-batches x micro-batches with rows that train on nothing
    (as `Joint` pads them); the whitening spans every role's trained tokens (MARCH's joint batch)."""

    inner: Any
    critic: Critic
    token_rewards: tuple = ()

    def __call__(self, run, state, params, ro, adv, records, step: int, clock: step_time.StageClock, *,
                 frozen: bool) -> Updated:
        c, (n, t) = self.critic, ro.completion_mask_BT.shape
        rewards_BT, metrics = np.asarray(adv.adv_BT, np.float32), {}
        for term in self.token_rewards:
            r_BT, term_metrics = term(ro)
            rewards_BT, metrics = rewards_BT + r_BT, {**metrics, **term_metrics}
        zeros_BT = np.zeros((n, t), np.float32)
        padded = pad_rows(ValueBatch(ro.tokens_BL, ro.mask_BL, np.asarray(ro.completion_mask_BT, bool), zeros_BT,
                                     zeros_BT), 0, row_multiple(run))
        k = padded.tokens_BL.shape[0] - n  # a multi-agent rollout's padding rows (as `Joint` pads them)
        rows = shard_batch(run, (padded.tokens_BL, padded.mask_BL))
        with clock("values"):
            values_BT = hosts.to_host(step_time.synced(c.values(*rows, t)))
        mask_BT = padded.completion_mask_BT
        values_BT = np.where(mask_BT, values_BT, 0.0).astype(np.float32)
        rewards_BT = np.concatenate([rewards_BT, np.zeros((k, t), np.float32)])
        adv_BT, returns_BT = jax.device_get(gae_BT(rewards_BT, values_BT, mask_BT, gamma=c.spec.gamma,
                                                   lam=c.spec.lam, whiten=c.spec.whiten))
        warm = step <= c.spec.warmup_steps
        out = self.inner(run, state, params, ro, adv._replace(adv_BT=np.asarray(adv_BT[:n], np.float32)), records,
                         step, clock, frozen=frozen or warm)
        batch = shard_batch(run, ValueBatch(*rows, mask_BT, values_BT, np.asarray(returns_BT, np.float32)))
        with clock("update_critic"):
            c.state, critic_metrics = minibatch_steps(run, c.step_fn, c.state, batch,
                                                      minibatch_rows(n + k, 1, run.update, step, stream=1))
            step_time.synced(c.state)
        metrics.update(critic_metrics)
        nonfinite = max(metrics.pop("train/nonfinite"), out.metrics.get("train/nonfinite", 0.0))
        metrics.update(_rollout_stats(values_BT, np.asarray(returns_BT), mask_BT), **{"critic/warmup": float(warm)})
        return Updated(out.state, {**out.metrics, **metrics, "train/nonfinite": nonfinite}, out.group)

    def begin(self, policy_params) -> None:
        self.critic.start_from(policy_params)

    def arrays(self) -> dict[str, Any]:
        return {"critic": self.critic.arrays()}

    def load(self, arrays: dict[str, Any]) -> None:
        self.critic.load(arrays["critic"])


def _rollout_stats(values_BT: np.ndarray, returns_BT: np.ndarray, mask_BT: np.ndarray) -> dict[str, float]:
    """The rollout's mean value and return on the trained tokens, and verl's explained variance
    `critic/vf_explained_var` = 1 − Var(R − V) / (Var(R) + 1e-5) (unbiased variances)."""
    v, r = values_BT[mask_BT].astype(np.float64), returns_BT[mask_BT].astype(np.float64)
    if v.size < 2:
        return {}
    return {"critic/values_mean": float(v.mean()), "critic/returns_mean": float(r.mean()),
            "critic/vf_explained_var": 1.0 - float(np.var(r - v, ddof=1)) / (float(np.var(r, ddof=1)) + 1e-5)}
