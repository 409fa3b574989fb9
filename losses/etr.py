"""ETR elastic trust regions: per-sample clip bounds from advantage magnitude and group reward spread.

READING, not the paper's verified equations: "ETR: Outcome-Guided Elastic Trust Regions for Policy
Optimization", Zhang et al., arXiv:2601.03723, has no public code and only its abstract was available. The
form below is the project spec's reading (spec section 2), with both factors pluggable:

  phi(a)     = 1 + alpha * min(a, a_max)            micro elasticity, a = |A_i|
  psi(sigma) = 1 + beta * sigma                     macro elasticity, sigma = std of rewards in the group of i
  eps_low_i  = min(eps_low * phi(|A_i|) * psi(sigma_g), clip_low_max)
  eps_high_i = eps_high * phi(|A_i|) * psi(sigma_g)
  loss       = GRPO clipped surrogate with the per-sample bounds (`jaxrl.losses.grpo.policy_loss`)

With alpha = beta = 0 the bounds are exactly eps_low / eps_high and the loss equals GRPO bit for bit.
Choices: sigma_g is the unbiased group std (as the GRPO advantage); eps_low_i is capped at `clip_low_max` < 1
so that the ratio floor 1 - eps_low_i stays positive.
"""

import dataclasses
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses import grpo
from jaxrl.losses.advantages import _check_rewards

FactorFn = Callable[[chex.Array], chex.Array]


@dataclasses.dataclass(frozen=True)
class ETRConfig:
    """ETR coefficients (READING, spec section 2).

    clip_low / clip_high: base bounds eps_low / eps_high; alpha, adv_cap (a_max, None = no cap): micro factor;
    beta: macro factor; clip_low_max: cap on eps_low_i. No published defaults exist: alpha = beta = 0 is GRPO.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    alpha: float = 0.0
    beta: float = 0.0
    adv_cap: float | None = None
    clip_low_max: float = 0.95

    def __post_init__(self):
        if not 0.0 <= self.clip_low <= self.clip_low_max < 1.0:
            raise ValueError(
                f"ETRConfig needs 0 <= clip_low <= clip_low_max < 1, got {self.clip_low}, {self.clip_low_max}"
            )
        if self.clip_high < 0 or self.alpha < 0 or self.beta < 0:
            raise ValueError(
                f"ETRConfig.clip_high, alpha, beta must be >= 0, "
                f"got {self.clip_high}, {self.alpha}, {self.beta}"
            )


def group_reward_std(rewards_B: chex.Array, group_size: int) -> chex.Array:
    """Unbiased std of the rewards of each sample's group, broadcast to [B] (0 for group size 1)."""
    _check_rewards(rewards_B, group_size)
    r_PG = rewards_B.reshape(-1, group_size)
    std_P1 = jnp.std(r_PG, axis=1, ddof=1, keepdims=True) if group_size > 1 else jnp.zeros_like(r_PG)
    return jnp.broadcast_to(std_P1, r_PG.shape).reshape(-1)


def micro_factor(alpha: float, adv_cap: float | None = None) -> FactorFn:
    """phi(a) = 1 + alpha * min(a, a_max)."""
    return lambda a_B: 1.0 + alpha * (a_B if adv_cap is None else jnp.minimum(a_B, adv_cap))


def macro_factor(beta: float) -> FactorFn:
    """psi(sigma) = 1 + beta * sigma."""
    return lambda sigma_B: 1.0 + beta * sigma_B


def etr_clip_bounds(
    adv_B: chex.Array,
    group_std_B: chex.Array,
    cfg: ETRConfig,
    *,
    micro_fn: FactorFn | None = None,
    macro_fn: FactorFn | None = None,
) -> tuple[chex.Array, chex.Array]:
    """Per-sample (eps_low_B, eps_high_B) = base bounds x phi(|A|) x psi(sigma_g) (module docstring).

    Args:
      adv_B: [B] per-sample advantages A_i.
      group_std_B: [B] group reward std sigma_g(i) (`group_reward_std`).
      cfg: ETRConfig.
      micro_fn, macro_fn: replacements for phi and psi (default: `micro_factor(cfg.alpha, cfg.adv_cap)`,
        `macro_factor(cfg.beta)`).

    Returns:
      ([B], [B]) clip bounds, constant w.r.t. gradients.
    """
    chex.assert_rank([adv_B, group_std_B], 1)
    chex.assert_equal_shape([adv_B, group_std_B])
    micro_fn = micro_factor(cfg.alpha, cfg.adv_cap) if micro_fn is None else micro_fn
    macro_fn = macro_factor(cfg.beta) if macro_fn is None else macro_fn
    scale_B = jax.lax.stop_gradient(micro_fn(jnp.abs(adv_B)) * macro_fn(group_std_B))
    eps_low_B = jnp.minimum(cfg.clip_low * scale_B, cfg.clip_low_max)
    return eps_low_B, cfg.clip_high * scale_B


def etr_policy_loss(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    adv_B: chex.Array,
    group_std_B: chex.Array,
    mask_BT: chex.Array,
    cfg: ETRConfig,
    *,
    micro_fn: FactorFn | None = None,
    macro_fn: FactorFn | None = None,
    **policy_kwargs,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """GRPO clipped surrogate with ETR per-sample bounds; `policy_kwargs` go to `grpo.policy_loss`
    (dual_clip, agg, ratio_level, horizon, normalizer). Adds metrics `etr/clip_low_mean`,
    `etr/clip_high_mean`.
    """
    chex.assert_rank([logp_BT, mask_BT], 2)
    eps_low_B, eps_high_B = etr_clip_bounds(adv_B, group_std_B, cfg, micro_fn=micro_fn, macro_fn=macro_fn)
    loss, metrics = grpo.policy_loss(
        logp_BT, old_logp_BT, adv_B, mask_BT, clip_low=eps_low_B, clip_high=eps_high_B, **policy_kwargs
    )
    metrics["etr/clip_low_mean"] = jnp.mean(eps_low_B)
    metrics["etr/clip_high_mean"] = jnp.mean(eps_high_B)
    return loss, metrics
