"""Algorithm table: how each selectable algorithm turns rewards into advantages and clip bounds.

One explicit, greppable mapping (STYLE.md principle 15): `ADVANTAGES[Algo]`. Every entry is a function of
arrays plus a small frozen `AdvantageSpec` (read from the experiment config once, at the edge):

    (rewards_NK, weights_K, completion_mask_NT, spec) -> Advantages(adv_NT, clip_low_N, clip_high_N, metrics)

Advantages are per token (`adv_NT`) so that token-level estimators (GD²PO, verl-style GDPO) and sequence-level
ones (broadcast over the completion mask) share one train step. Rewards that failed with `on_error: skip`
arrive as NaN: single-reward estimators leave them out of the group statistics and give them advantage 0 (TRL
semantics); multi-reward estimators treat them as 0 (the NVlabs GDPO fork's choice).

| algo     | rewards combined            | advantage                          | clip bounds            |
|----------|-----------------------------|------------------------------------|------------------------|
| grpo     | weighted sum                | (R - mean_g) / (std_g + eps)       | [clip_low, clip_high]  |
| dr_grpo  | weighted sum                | R - mean_g                         | same                   |
| dapo     | weighted sum (+ overlong)   | GRPO, degenerate groups resampled  | clip-higher            |
| rloo     | weighted sum                | leave-one-out baseline             | same                   |
| gdpo     | per reward, then batch norm | `losses.gdpo_advantages`           | same                   |
| gd2po    | per reward, conflict filter | `losses.gd2po_advantages`          | same                   |
| etr      | weighted sum                | GRPO                               | elastic per sample     |
| clipo    | weighted sum + bonus        | GRPO (bonus added by the trainer)  | same                   |
| sft_aux  | weighted sum                | GRPO (+ SFT rows in the loss)      | same                   |
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrl import losses
from jaxrl.config import Algo


@dataclasses.dataclass(frozen=True)
class AdvantageSpec:
    group_size: int
    eps: float = 1e-6
    clip_low: float = 0.2
    clip_high: float = 0.2
    etr_alpha: float = 0.0
    etr_beta: float = 0.0
    etr_adv_max: float | None = None
    gd2po_mode: str = "hard"
    gd2po_tau: float = 0.2


class Advantages(NamedTuple):
    adv_NT: np.ndarray
    clip_low_N: np.ndarray
    clip_high_N: np.ndarray
    metrics: dict[str, float]


def combined_reward(rewards_NK: np.ndarray, weights_K: np.ndarray) -> np.ndarray:
    """Weighted sum over rewards; NaN (a skipped reward) stays NaN so the estimator can exclude the sample."""
    return (rewards_NK * weights_K[None, :]).sum(axis=1).astype(np.float32)


def _finish(adv_N, mask_NT, spec: AdvantageSpec, metrics=None) -> Advantages:
    adv_N = np.asarray(adv_N, np.float32)
    n = adv_N.shape[0]
    return Advantages(
        adv_NT=adv_N[:, None] * np.asarray(mask_NT, np.float32),
        clip_low_N=np.full((n,), spec.clip_low, np.float32),
        clip_high_N=np.full((n,), spec.clip_high, np.float32),
        metrics=dict(metrics or {}),
    )


def _grpo(scale: str):
    def fn(rewards_NK, weights_K, mask_NT, spec):
        r_N = combined_reward(rewards_NK, weights_K)
        adv_N = losses.group_advantages(jnp.asarray(r_N), spec.group_size, scale=scale, eps=spec.eps,
                                        nan_aware=True)
        return _finish(adv_N, mask_NT, spec)
    return fn


def _rloo(rewards_NK, weights_K, mask_NT, spec):
    r_N = np.nan_to_num(combined_reward(rewards_NK, weights_K))
    return _finish(losses.rloo_advantages(jnp.asarray(r_N), spec.group_size), mask_NT, spec)


def _gdpo(rewards_NK, weights_K, mask_NT, spec):
    r_NK = jnp.asarray(np.nan_to_num(rewards_NK))
    adv_N = losses.gdpo_advantages(r_NK, spec.group_size, weights=weights_K, eps=spec.eps)
    return _finish(adv_N, mask_NT, spec)


def _gd2po(rewards_NK, weights_K, mask_NT, spec):
    r_NK = jnp.asarray(np.nan_to_num(rewards_NK))
    adv_NT, metrics = losses.gd2po_advantages(
        r_NK, spec.group_size, jnp.asarray(mask_NT), mode=spec.gd2po_mode, tau=spec.gd2po_tau,
        weights=weights_K, eps=spec.eps,
    )
    base = _finish(np.zeros(r_NK.shape[0]), mask_NT, spec)
    return base._replace(adv_NT=np.asarray(adv_NT, np.float32),
                         metrics={k: float(v) for k, v in metrics.items()})


def _etr(rewards_NK, weights_K, mask_NT, spec):
    r_N = jnp.asarray(combined_reward(rewards_NK, weights_K))
    adv_N = losses.group_advantages(r_N, spec.group_size, scale="group", eps=spec.eps, nan_aware=True)
    cfg = losses.ETRConfig(clip_low=spec.clip_low, clip_high=spec.clip_high, alpha=spec.etr_alpha,
                           beta=spec.etr_beta, adv_cap=spec.etr_adv_max)
    std_N = losses.group_reward_std(jnp.nan_to_num(r_N), spec.group_size)
    low_N, high_N = losses.etr_clip_bounds(adv_N, std_N, cfg)
    out = _finish(adv_N, mask_NT, spec, {"etr/clip_low_mean": float(jnp.mean(low_N)),
                                         "etr/clip_high_mean": float(jnp.mean(high_N))})
    return out._replace(clip_low_N=np.asarray(low_N, np.float32), clip_high_N=np.asarray(high_N, np.float32))


AdvantageFn = Callable[[np.ndarray, np.ndarray, np.ndarray, AdvantageSpec], Advantages]

ADVANTAGES: dict[Algo, AdvantageFn] = {
    Algo.GRPO: _grpo("group"),
    Algo.DR_GRPO: _grpo("none"),
    Algo.DAPO: _grpo("group"),
    Algo.RLOO: _rloo,
    Algo.GDPO: _gdpo,
    Algo.GD2PO: _gd2po,
    Algo.ETR: _etr,
    Algo.CLIPO: _grpo("group"),
    Algo.SFT_AUX: _grpo("group"),
}
