"""Multi-reward combiners: plain weighted sum, Reference-Frozen Normalization, Tri-Factor Adaptive Weighting.

READING, not verified equations: "Quark Medical Alignment" (arXiv:2602.11661) names Reference-Frozen
Normalization and Tri-Factor Adaptive Dynamic Weighting (weakness-aware, risk-prioritised,
redundancy-reducing) but publishes no code or formulas that we could read. The forms below follow the project
spec (section 7h) and every factor is pluggable:

  reference-frozen norm:  r~_k = (r_k - mu_k^ref) / (sigma_k^ref + eps), with mu^ref, sigma^ref measured once
                          on the frozen reference policy's outputs and then kept fixed
  tri-factor weights:     w_k ∝ f_weak(k) f_risk(k) f_red(k),  sum_k w_k = 1
      default f_weak = softmax_k(-temperature * mean_i r~_ik)          (focus on weak dimensions)
      default f_risk = fixed priorities, normalised to sum 1           (e.g. safety > compliance > style)
      default f_red  = 1 - max_{j != k} |corr(r~_k, r~_j)|            (down-weight redundant rewards)
  combined reward:        R_i = sum_k w_k r~_ik, then GRPO/PPO advantages.

Choices: sigma^ref is the unbiased std; a constant reward column has correlation 0 with the others; with
K = 1, f_red = 1. The weights are treated as constants (stop_gradient) because they are a schedule, not a
loss term.
"""

from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

FactorFn = Callable[[chex.Array], chex.Array]  # normalised rewards [B, R] -> non-negative factor [R]


class RewardStats(NamedTuple):
    """Frozen per-reward statistics of the reference policy: mean_R and std_R."""

    mean_R: chex.Array
    std_R: chex.Array


def weighted_sum(rewards_BR: chex.Array, weights_R) -> chex.Array:
    """R_i = sum_k w_k r_ik.  Args: rewards_BR [B, R]; weights_R [R].  Returns [B]."""
    chex.assert_rank(rewards_BR, 2)
    w_R = jnp.asarray(weights_R, rewards_BR.dtype)
    if w_R.shape != rewards_BR.shape[1:]:
        raise ValueError(f"weights_R must have shape ({rewards_BR.shape[1]},), got {w_R.shape}")
    return rewards_BR @ w_R


def reference_stats(ref_rewards_BR: chex.Array) -> RewardStats:
    """Measures mu_k^ref and unbiased sigma_k^ref once, on rewards of the frozen reference policy's samples."""
    chex.assert_rank(ref_rewards_BR, 2)
    if ref_rewards_BR.shape[0] < 2:
        raise ValueError(f"reference_stats needs at least 2 samples, got {ref_rewards_BR.shape[0]}")
    return RewardStats(jnp.mean(ref_rewards_BR, axis=0), jnp.std(ref_rewards_BR, axis=0, ddof=1))


def reference_frozen_normalize(
    rewards_BR: chex.Array, stats: RewardStats, *, eps: float = 1e-6
) -> chex.Array:
    """r~_ik = (r_ik - mu_k^ref) / (sigma_k^ref + eps).  Returns [B, R]."""
    chex.assert_rank(rewards_BR, 2)
    chex.assert_shape([stats.mean_R, stats.std_R], rewards_BR.shape[1:])
    return (rewards_BR - stats.mean_R) / (stats.std_R + eps)


def weakness_factor(temperature: float = 1.0) -> FactorFn:
    """f_weak = softmax_k(-temperature * mean_i r~_ik)."""
    return lambda norm_BR: jax.nn.softmax(-temperature * jnp.mean(norm_BR, axis=0))


def risk_factor(priorities_R) -> FactorFn:
    """f_risk = priorities / sum(priorities) (fixed, e.g. safety > compliance > style)."""
    p_R = jnp.asarray(priorities_R, jnp.float32)
    return lambda norm_BR: p_R / jnp.sum(p_R)


def redundancy_factor(eps: float = 1e-12) -> FactorFn:
    """f_red = 1 - max_{j != k} |corr(r~_k, r~_j)| over the batch (1 when K = 1)."""

    def fn(norm_BR: chex.Array) -> chex.Array:
        k = norm_BR.shape[1]
        if k == 1:
            return jnp.ones((1,), norm_BR.dtype)
        centred_BR = norm_BR - jnp.mean(norm_BR, axis=0)
        cov_KK = centred_BR.T @ centred_BR
        norm_R = jnp.sqrt(jnp.diag(cov_KK))
        corr_KK = cov_KK / (norm_R[:, None] * norm_R[None, :] + eps)
        off_KK = jnp.where(jnp.eye(k, dtype=bool), 0.0, jnp.abs(corr_KK))
        return 1.0 - jnp.max(off_KK, axis=1)

    return fn


def tri_factor_weights(
    norm_BR: chex.Array, factors: tuple[FactorFn, ...], *, eps: float = 1e-12
) -> chex.Array:
    """w_k = prod_f f(norm)_k / sum_j prod_f f(norm)_j (uniform if every product is 0). Returns [R]."""
    chex.assert_rank(norm_BR, 2)
    k = norm_BR.shape[1]
    prod_R = jnp.ones((k,), jnp.float32)
    for factor in factors:
        f_R = factor(norm_BR)
        chex.assert_shape(f_R, (k,))
        prod_R = prod_R * f_R
    total = jnp.sum(prod_R)
    w_R = jnp.where(total > eps, prod_R / jnp.maximum(total, eps), 1.0 / k)
    return jax.lax.stop_gradient(w_R)


def combine_rewards(
    rewards_BR: chex.Array,
    stats: RewardStats,
    *,
    factors: tuple[FactorFn, ...] | None = None,
    weights_R=None,
    eps: float = 1e-6,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Reference-frozen normalisation, then a weighted sum with fixed `weights_R` or tri-factor weights.

    Args:
      rewards_BR: [B, R] raw rewards.  stats: frozen reference `RewardStats`.
      factors: factor functions for `tri_factor_weights` (default: weakness_factor(), redundancy_factor());
        ignored when `weights_R` is given.
      weights_R: [R] fixed weights (skips the adaptive weighting).
      eps: normalisation eps.

    Returns:
      ([B] combined rewards, {"reward/weight_<k>": w_k}).
    """
    norm_BR = reference_frozen_normalize(rewards_BR, stats, eps=eps)
    if weights_R is None:
        factors = (weakness_factor(), redundancy_factor()) if factors is None else factors
        weights_R = tri_factor_weights(norm_BR, factors)
    combined_B = weighted_sum(norm_BR, weights_R)
    w_R = jnp.asarray(weights_R)
    return combined_B, {f"reward/weight_{k}": w_R[k] for k in range(w_R.shape[0])}
