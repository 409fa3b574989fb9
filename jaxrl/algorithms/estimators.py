"""Advantage functions of the built-in algorithms: rewards_BR -> per-token advantages and clip bounds.

| algo     | rewards combined              | advantage                                  | clip bounds           |
|----------|-------------------------------|--------------------------------------------|-----------------------|
| grpo     | weighted sum                  | (R - mean_g) / (std_g + eps)               | [clip.low, clip.high] |
| dr_grpo  | weighted sum                  | R - mean_g                                 | same                  |
| rloo     | weighted sum                  | leave-one-out baseline                     | same                  |
| gdpo     | per reward, then batch norm   | `losses.gdpo_advantages` (`batch_norm`)    | same                  |
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

import dataclasses
import enum
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import losses
from jaxrl._checks import check as _check
from jaxrl.algorithms.base import AlgoSettings, Advantages, combined_reward, sequence_advantages


class BatchNorm(str, enum.Enum):
    """GDPO's batch standardisation of the summed advantages: over samples (TRL) or over tokens (verl)."""

    SAMPLE = "sample"
    TOKEN = "token"


class GD2POMode(str, enum.Enum):
    """GD²PO conflict filter: drop every conflicting sample, or only those with a small signal-to-noise."""

    HARD = "hard"
    SNR = "snr"


@dataclasses.dataclass(frozen=True)
class GDPOParams:
    """`algorithm.params` of gdpo: `batch_norm` sample (TRL, default) or token (verl form, as GD²PO uses)."""

    batch_norm: BatchNorm = BatchNorm.SAMPLE


@dataclasses.dataclass(frozen=True)
class GD2POParams:
    """`algorithm.params` of gd2po (`losses.gd2po_advantages`): mode, SNR threshold τ, ε of the SNR
    denominator."""

    mode: GD2POMode = GD2POMode.HARD
    tau: float = 0.2
    eps_snr: float = 1e-6

    def __post_init__(self):
        _check(0 <= self.tau <= 1, "algorithm.params.tau", self.tau, "must be in [0, 1]")
        _check(self.eps_snr > 0, "algorithm.params.eps_snr", self.eps_snr, "must be > 0")


@dataclasses.dataclass(frozen=True)
class ETRParams:
    """`algorithm.params` of etr: elasticities α, β and the advantage cap of the elastic clip bounds
    [READING] (`losses.etr`)."""

    alpha: float = 0.0
    beta: float = 0.0
    adv_max: float = 3.0

    def __post_init__(self):
        for name in ("alpha", "beta", "adv_max"):
            _check(getattr(self, name) >= 0, f"algorithm.params.{name}", getattr(self, name), "must be >= 0")


@dataclasses.dataclass(frozen=True)
class ReinforcePPParams:
    """`algorithm.params` of reinforce_pp: discount γ of the last-token reward per trained token (verl
    `algorithm.gamma`, default 1: every token's return is the reward)."""

    gamma: float = 1.0

    def __post_init__(self):
        _check(0 <= self.gamma <= 1, "algorithm.params.gamma", self.gamma, "must be in [0, 1]")


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
    over samples (`algorithm.params.batch_norm: sample`, TRL) or over tokens (`token`, verl). With a single
    reward the reference (NVlabs/GDPO) falls back to plain GRPO, and so does this."""
    if rewards_BR.shape[1] == 1:
        return grpo("group")(rewards_BR, weights_R, mask_BT, s)
    r_BR = jnp.asarray(np.nan_to_num(rewards_BR))
    if s.params.batch_norm is BatchNorm.TOKEN:
        adv_BT = losses.gdpo_token_advantages(r_BR, s.group_size, jnp.asarray(mask_BT), weights=weights_R,
                                              eps=s.eps)
        return sequence_advantages(np.zeros(r_BR.shape[0]), mask_BT, s)._replace(
            adv_BT=np.asarray(adv_BT, np.float32))
    adv_B = _jitted(losses.gdpo_advantages, group_size=s.group_size, eps=s.eps)(
        r_BR, weights=None if weights_R is None else jnp.asarray(weights_R))
    return sequence_advantages(adv_B, mask_BT, s)


def gd2po(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """GD²PO: GDPO with conflicting samples filtered (hard, or by signal-to-noise) and consensus scaling."""
    c = s.params
    r_BR = jnp.asarray(np.nan_to_num(rewards_BR))
    adv_BT, metrics = losses.gd2po_advantages(
        r_BR, s.group_size, jnp.asarray(mask_BT), mode=c.mode.value, tau=c.tau, weights=weights_R, eps=s.eps,
        eps_snr=c.eps_snr)
    base = sequence_advantages(np.zeros(r_BR.shape[0]), mask_BT, s)
    return base._replace(adv_BT=np.asarray(adv_BT, np.float32),
                         metrics={k: float(v) for k, v in metrics.items()})


def etr(rewards_BR, weights_R, mask_BT, s: AlgoSettings) -> Advantages:
    """ETR [READING]: GRPO advantages with elastic per-sample clip bounds (`losses.etr_clip_bounds`)."""
    c = s.params
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
    γ = `algorithm.params.gamma`."""
    r_B = jnp.asarray(combined_reward(rewards_BR, weights_R))
    adv_BT = losses.reinforce_pp_advantages(r_B, jnp.asarray(mask_BT), gamma=s.params.gamma,
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
