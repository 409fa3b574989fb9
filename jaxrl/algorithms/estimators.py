"""Advantage functions of the built-in algorithms: rewards_BR -> per-token advantages and clip bounds.

| algo     | rewards combined              | advantage                                  | clip bounds           |
|----------|-------------------------------|--------------------------------------------|-----------------------|
| grpo     | weighted sum                  | (R - mean_g) / (std_g + eps)               | [clip.low, clip.high] |
| dr_grpo  | weighted sum                  | R - mean_g                                 | same                  |
| rloo     | weighted sum                  | leave-one-out baseline                     | same                  |
| gdpo     | per reward, then batch norm   | `losses.gdpo_advantages` (gdpo.batch_norm) | same                  |
| gd2po    | per reward, conflict filter   | `losses.gd2po_advantages`                  | same                  |
| etr      | weighted sum                  | GRPO                                       | elastic per sample    |
| rf++     | weighted sum                  | γ-return, whitened over the batch's tokens | [clip.low, clip.high] |
| rf++ b.  | weighted sum                  | R - mean_g, whitened over batch tokens     | same                  |
| ppo      | weighted sum                  | GAE(γ, λ) with a critic (`jaxrl.rl.critic`) | same                  |

(rf++: `reinforce_pp`; rf++ b.: `reinforce_pp_baseline`.)

Rewards that failed with `on_error: skip` arrive as NaN: single-reward estimators leave them out of the group
statistics and give them advantage 0 (TRL semantics); multi-reward estimators treat them as 0 (the NVlabs GDPO
fork's choice).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import losses
from jaxrl.algorithms.base import AlgoSettings, Advantages, combined_reward, sequence_advantages


@functools.lru_cache(maxsize=None)
def _jitted(fn, **static):
    """`fn` with its `static` settings as one XLA program per input shape (cached on disk with the rest):
    run eagerly, the GDPO advantages alone were 31 small programs compiled in every process (about 1 s)."""
    return jax.jit(functools.partial(fn, **static))


def grpo(scale: str):
    """GRPO (scale "group", arXiv:2402.03300) or Dr.GRPO (scale "none", arXiv:2503.20783) on the summed
    reward."""

    def advantages(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
        r_B = combined_reward(rewards_BR, weights_R)
        adv_B = _jitted(losses.group_advantages, group_size=s.group_size, scale=scale, eps=s.eps,
                        nan_aware=True)(jnp.asarray(r_B))
        return sequence_advantages(adv_B, mask_BT, s)

    return advantages


def rloo(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """RLOO: the leave-one-out mean of the group as baseline (arXiv:2402.14740)."""
    r_B = np.nan_to_num(combined_reward(rewards_BR, weights_R))
    adv_B = _jitted(losses.rloo_advantages, group_size=s.group_size)(jnp.asarray(r_B))
    return sequence_advantages(adv_B, mask_BT, s)


def gdpo(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """GDPO (arXiv:2601.05242): each reward normalised within its group, weighted sum, batch standardisation
    over samples (`gdpo.batch_norm: sample`, TRL) or over tokens (`token`, verl). With a single reward the
    reference (NVlabs/GDPO) falls back to plain GRPO, and so does this."""
    if rewards_BR.shape[1] == 1:
        return grpo("group")(rewards_BR, weights_R, mask_BT, s)
    r_BR = jnp.asarray(np.nan_to_num(rewards_BR))
    if s.section.gdpo.batch_norm.value == "token":
        adv_BT = losses.gdpo_token_advantages(r_BR, s.group_size, jnp.asarray(mask_BT), weights=weights_R,
                                              eps=s.eps)
        return sequence_advantages(np.zeros(r_BR.shape[0]), mask_BT, s)._replace(
            adv_BT=np.asarray(adv_BT, np.float32))
    adv_B = _jitted(losses.gdpo_advantages, group_size=s.group_size, eps=s.eps)(
        r_BR, weights=None if weights_R is None else jnp.asarray(weights_R))
    return sequence_advantages(adv_B, mask_BT, s)


def gd2po(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """GD²PO: GDPO with conflicting samples filtered (hard, or by signal-to-noise) and consensus scaling."""
    c = s.section.gd2po
    r_BR = jnp.asarray(np.nan_to_num(rewards_BR))
    adv_BT, metrics = losses.gd2po_advantages(
        r_BR, s.group_size, jnp.asarray(mask_BT), mode=c.mode.value, tau=c.tau, weights=weights_R, eps=s.eps,
        eps_snr=c.eps_snr)
    base = sequence_advantages(np.zeros(r_BR.shape[0]), mask_BT, s)
    return base._replace(adv_BT=np.asarray(adv_BT, np.float32),
                         metrics={k: float(v) for k, v in metrics.items()})


def etr(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """ETR [READING]: GRPO advantages with elastic per-sample clip bounds (`losses.etr_clip_bounds`)."""
    c = s.section.etr
    r_B = jnp.asarray(combined_reward(rewards_BR, weights_R))
    adv_B = _jitted(losses.group_advantages, group_size=s.group_size, scale="group", eps=s.eps,
                    nan_aware=True)(r_B)
    cfg = losses.ETRConfig(clip_low=s.clip_low, clip_high=s.clip_high, alpha=c.alpha, beta=c.beta,
                           adv_cap=c.adv_max)
    std_B = losses.group_reward_std(jnp.nan_to_num(r_B), s.group_size)
    low_B, high_B = losses.etr_clip_bounds(adv_B, std_B, cfg)
    out = sequence_advantages(adv_B, mask_BT, s, {"etr/clip_low_mean": float(jnp.mean(low_B)),
                                                  "etr/clip_high_mean": float(jnp.mean(high_B))})
    return out._replace(clip_low_B=np.asarray(low_B, np.float32), clip_high_B=np.asarray(high_B, np.float32))


def reinforce_pp(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """REINFORCE++ (arXiv:2501.03262, verl `reinforce_plus_plus`): `losses.reinforce_pp_advantages` with
    γ = `algorithm.reinforce_pp.gamma`."""
    r_B = jnp.asarray(combined_reward(rewards_BR, weights_R))
    adv_BT = losses.reinforce_pp_advantages(r_B, jnp.asarray(mask_BT), gamma=s.section.reinforce_pp.gamma,
                                            nan_aware=True)
    return _token_advantages(adv_BT, mask_BT, s)


def reinforce_pp_baseline(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """REINFORCE++-baseline (verl `reinforce_plus_plus_baseline`):
    `losses.reinforce_pp_baseline_advantages`."""
    r_B = jnp.asarray(combined_reward(rewards_BR, weights_R))
    adv_BT = losses.reinforce_pp_baseline_advantages(r_B, s.group_size, jnp.asarray(mask_BT), nan_aware=True)
    return _token_advantages(adv_BT, mask_BT, s)


def outcome_rewards(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """PPO's estimator stage (`Algorithm.critic`): the per-token rewards r_BT, the weighted reward at each
    row's last trained token (verl's `token_level_rewards`; a skipped, NaN, reward counts 0), which the run's
    critic turns into GAE advantages (`jaxrl.rl.critic.ActorCritic`)."""
    r_B = jnp.asarray(np.nan_to_num(combined_reward(rewards_BR, weights_R)))
    return _token_advantages(losses.outcome_token_rewards(r_B, jnp.asarray(mask_BT)), mask_BT, s)


def _token_advantages(adv_BT, mask_BT, s: AlgoSettings) -> Advantages:
    """Per-token advantages with the constant clip bounds."""
    base = sequence_advantages(np.zeros(np.shape(mask_BT)[0]), mask_BT, s)
    return base._replace(adv_BT=np.asarray(adv_BT, np.float32))
