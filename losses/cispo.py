"""CISPO: REINFORCE with a clipped, stop-gradient importance-sampling weight.

    r_it = exp(ℓp_it − ℓp^old_it)
    ŵ_it = clip(r_it, w_min, w_max)                 (a constant: no gradient through it)
    l_it = − sg[ŵ_it] · A_it · ℓp_it                ∂l_it/∂ℓp_it = − ŵ_it A_it

MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", arXiv:2506.13585
(also the loss of ScaleRL, arXiv:2510.13786). Symbols: w_min = 1 − ε_low^IS, w_max = 1 + ε_high^IS (paper).
Unlike PPO's clip, a token whose ratio leaves the band keeps its gradient (scaled by the capped weight).
The loss *value* is not a surrogate of the return (only its gradient matters). Paper aggregation: token-mean.

The bounds here are absolute weights. The two reference libraries parameterise them differently
(spec algorithms-2 §2), so `CISPOConfig.verl` and `CISPOConfig.trl` translate their settings:
* verl `loss_mode=cispo`: ŵ = clip(r, 1 − clip_ratio_low, 1 + clip_ratio_high) (defaults 0.2 / 0.2; recipe
  clip_ratio_low=10 (no lower bound), clip_ratio_high=0.2); log-ratio clamped at ±20 before exp.
* TRL `loss_type="cispo"`: ŵ = min(r, epsilon_high), an absolute cap with no lower bound; `epsilon_high`
  unset falls back to `epsilon` = 0.2, i.e. REINFORCE scaled by 0.2 — so `w_max` has no default here.

Choices: the log ratio is clamped at ±`max_log_ratio` (20, verl; TRL does not clamp); masked positions are
replaced by 0 before any arithmetic. Metrics are token-weighted: `cispo/clip_frac_high` is TRL's
`cispo_clip_ratio` (r > w_max and A > 0); `cispo/clip_frac` is verl's `pg_clipfrac` (r outside the band).
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses import aggregation

_MAX_LOG_RATIO = 20.0


@dataclasses.dataclass(frozen=True)
class CISPOConfig:
    """Absolute IS-weight bounds of CISPO: ŵ = clip(r, w_min, w_max); w_min=None means no lower bound."""

    w_max: float
    w_min: float | None = None

    def __post_init__(self):
        _check_bounds(self.w_min, self.w_max)

    @classmethod
    def verl(cls, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> "CISPOConfig":
        """verl `actor.clip_ratio_low/high`: [1 − low, 1 + high]; a bound <= 0 means none (recipe: low=10)."""
        w_min = 1.0 - clip_ratio_low
        return cls(w_max=1.0 + clip_ratio_high, w_min=w_min if w_min > 0.0 else None)

    @classmethod
    def trl(cls, epsilon_high: float) -> "CISPOConfig":
        """TRL `GRPOConfig(loss_type="cispo", epsilon_high=...)`: the cap, no lower bound (ScaleRL: 5.0)."""
        return cls(w_max=epsilon_high)


def _check_bounds(w_min: float | None, w_max: float) -> None:
    if not w_max > 0.0:
        raise ValueError(f"cispo: w_max must be > 0, got {w_max}")
    if w_min is not None and not 0.0 <= w_min <= w_max:
        raise ValueError(f"cispo: w_min must be None or in [0, w_max={w_max}], got {w_min}")


def cispo_objective(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    adv_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    w_max: float,
    w_min: float | None = None,
    max_log_ratio: float = _MAX_LOG_RATIO,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Per-token CISPO loss, to be minimised, unaggregated (module docstring for the equation).

    Args:
      logp_BT: [B, T] float log-probs of the sampled tokens under the current policy (differentiated).
      old_logp_BT: [B, T] float log-probs under the behaviour policy (constant).
      adv_BT: [B, T] float per-token advantages (constant).
      mask_BT: [B, T] mask, 1 = token trained on.
      w_max: upper bound of the IS weight (absolute; verl 1 + clip_ratio_high, TRL epsilon_high).
      w_min: lower bound of the IS weight, None = none (the paper's practice).
      max_log_ratio: the log ratio is clamped to ±max_log_ratio before exp (verl 20).

    Returns:
      (loss_BT [B, T], 0 on masked positions; metrics `cispo/clip_frac`, `cispo/clip_frac_high`,
      `cispo/clip_frac_low`, `cispo/weight_mean`, `pg/approx_kl`, `pg/ratio_mean`, `pg/ratio_max`).
    """
    chex.assert_rank([logp_BT, old_logp_BT, adv_BT, mask_BT], 2)
    chex.assert_equal_shape([logp_BT, old_logp_BT, adv_BT, mask_BT])
    chex.assert_type([logp_BT, old_logp_BT, adv_BT], float)
    _check_bounds(w_min, w_max)
    valid_BT = mask_BT.astype(bool)
    adv_BT = jax.lax.stop_gradient(adv_BT)
    safe_logp_BT = jnp.where(valid_BT, logp_BT, 0.0)
    log_ratio_BT = jnp.where(valid_BT, logp_BT - jax.lax.stop_gradient(old_logp_BT), 0.0)
    log_ratio_BT = jax.lax.stop_gradient(jnp.clip(log_ratio_BT, -max_log_ratio, max_log_ratio))
    ratio_BT = jnp.exp(log_ratio_BT)
    weight_BT = jnp.clip(ratio_BT, w_min, w_max)
    loss_BT = jnp.where(valid_BT, -weight_BT * adv_BT * safe_logp_BT, 0.0)

    mean = lambda x_BT: aggregation.masked_mean(x_BT.astype(jnp.float32), mask_BT)
    high_BT = ratio_BT > w_max
    low_BT = ratio_BT < (0.0 if w_min is None else w_min)
    metrics = {
        "cispo/clip_frac": mean(high_BT | low_BT),
        "cispo/clip_frac_high": mean(high_BT & (adv_BT > 0)),
        "cispo/clip_frac_low": mean(low_BT),
        "cispo/weight_mean": mean(weight_BT),
        "pg/approx_kl": mean(-log_ratio_BT),
        "pg/ratio_mean": mean(ratio_BT),
        "pg/ratio_max": jnp.max(jnp.where(valid_BT, ratio_BT, 0.0)),
    }
    return loss_BT, metrics


def cispo_loss(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    adv_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    w_max: float,
    w_min: float | None = None,
    max_log_ratio: float = _MAX_LOG_RATIO,
    agg: "aggregation.AggMode | str" = "token-mean",
    normalizer: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """`cispo_objective` aggregated (default token-mean, the paper's 1/Σ|o_i|).

    Args: as `cispo_objective`, plus `agg` and `normalizer` of `aggregation.aggregate`.

    Returns:
      (scalar loss, metrics of `cispo_objective` plus `pg/loss`).
    """
    loss_BT, metrics = cispo_objective(logp_BT, old_logp_BT, adv_BT, mask_BT, w_max=w_max, w_min=w_min,
                                       max_log_ratio=max_log_ratio)
    loss = aggregation.aggregate(loss_BT, mask_BT, agg, normalizer=normalizer)
    return loss, {"pg/loss": jax.lax.stop_gradient(loss), **metrics}
