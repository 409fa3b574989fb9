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

FactorFn = Callable[[chex.Array], chex.Array]  # normalised rewards [N, K] -> non-negative factor [K]


class RewardStats(NamedTuple):
    """Frozen per-reward statistics of the reference policy: mean_K and std_K."""

    mean_K: chex.Array
    std_K: chex.Array


def weighted_sum(rewards_NK: chex.Array, weights_K) -> chex.Array:
    """R_i = sum_k w_k r_ik.  Args: rewards_NK [N, K]; weights_K [K].  Returns [N]."""
    chex.assert_rank(rewards_NK, 2)
    w_K = jnp.asarray(weights_K, rewards_NK.dtype)
    if w_K.shape != rewards_NK.shape[1:]:
        raise ValueError(f"weights_K must have shape ({rewards_NK.shape[1]},), got {w_K.shape}")
    return rewards_NK @ w_K


def reference_stats(ref_rewards_NK: chex.Array) -> RewardStats:
    """Measures mu_k^ref and unbiased sigma_k^ref once, on rewards of the frozen reference policy's samples."""
    chex.assert_rank(ref_rewards_NK, 2)
    if ref_rewards_NK.shape[0] < 2:
        raise ValueError(f"reference_stats needs at least 2 samples, got {ref_rewards_NK.shape[0]}")
    return RewardStats(jnp.mean(ref_rewards_NK, axis=0), jnp.std(ref_rewards_NK, axis=0, ddof=1))


def reference_frozen_normalize(
    rewards_NK: chex.Array, stats: RewardStats, *, eps: float = 1e-6
) -> chex.Array:
    """r~_ik = (r_ik - mu_k^ref) / (sigma_k^ref + eps).  Returns [N, K]."""
    chex.assert_rank(rewards_NK, 2)
    chex.assert_shape([stats.mean_K, stats.std_K], rewards_NK.shape[1:])
    return (rewards_NK - stats.mean_K) / (stats.std_K + eps)


def weakness_factor(temperature: float = 1.0) -> FactorFn:
    """f_weak = softmax_k(-temperature * mean_i r~_ik)."""
    return lambda norm_NK: jax.nn.softmax(-temperature * jnp.mean(norm_NK, axis=0))


def risk_factor(priorities_K) -> FactorFn:
    """f_risk = priorities / sum(priorities) (fixed, e.g. safety > compliance > style)."""
    p_K = jnp.asarray(priorities_K, jnp.float32)
    return lambda norm_NK: p_K / jnp.sum(p_K)


def redundancy_factor(eps: float = 1e-12) -> FactorFn:
    """f_red = 1 - max_{j != k} |corr(r~_k, r~_j)| over the batch (1 when K = 1)."""

    def fn(norm_NK: chex.Array) -> chex.Array:
        k = norm_NK.shape[1]
        if k == 1:
            return jnp.ones((1,), norm_NK.dtype)
        centred_NK = norm_NK - jnp.mean(norm_NK, axis=0)
        cov_KK = centred_NK.T @ centred_NK
        norm_K = jnp.sqrt(jnp.diag(cov_KK))
        corr_KK = cov_KK / (norm_K[:, None] * norm_K[None, :] + eps)
        off_KK = jnp.where(jnp.eye(k, dtype=bool), 0.0, jnp.abs(corr_KK))
        return 1.0 - jnp.max(off_KK, axis=1)

    return fn


def tri_factor_weights(
    norm_NK: chex.Array, factors: tuple[FactorFn, ...], *, eps: float = 1e-12
) -> chex.Array:
    """w_k = prod_f f(norm)_k / sum_j prod_f f(norm)_j (uniform if every product is 0). Returns [K]."""
    chex.assert_rank(norm_NK, 2)
    k = norm_NK.shape[1]
    prod_K = jnp.ones((k,), jnp.float32)
    for factor in factors:
        f_K = factor(norm_NK)
        chex.assert_shape(f_K, (k,))
        prod_K = prod_K * f_K
    total = jnp.sum(prod_K)
    w_K = jnp.where(total > eps, prod_K / jnp.maximum(total, eps), 1.0 / k)
    return jax.lax.stop_gradient(w_K)


def combine_rewards(
    rewards_NK: chex.Array,
    stats: RewardStats,
    *,
    factors: tuple[FactorFn, ...] | None = None,
    weights_K=None,
    eps: float = 1e-6,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Reference-frozen normalisation, then a weighted sum with fixed `weights_K` or tri-factor weights.

    Args:
      rewards_NK: [N, K] raw rewards.  stats: frozen reference `RewardStats`.
      factors: factor functions for `tri_factor_weights` (default: weakness_factor(), redundancy_factor());
        ignored when `weights_K` is given.
      weights_K: [K] fixed weights (skips the adaptive weighting).
      eps: normalisation eps.

    Returns:
      ([N] combined rewards, {"reward/weight_<k>": w_k}).
    """
    norm_NK = reference_frozen_normalize(rewards_NK, stats, eps=eps)
    if weights_K is None:
        factors = (weakness_factor(), redundancy_factor()) if factors is None else factors
        weights_K = tri_factor_weights(norm_NK, factors)
    combined_N = weighted_sum(norm_NK, weights_K)
    w_K = jnp.asarray(weights_K)
    return combined_N, {f"reward/weight_{k}": w_K[k] for k in range(w_K.shape[0])}
