"""PPO/GRPO clipped surrogate policy loss (asymmetric clip, dual clip, GSPO sequence ratio) and entropy bonus.

Deviations from / choices against the references (verl `compute_policy_loss_vanilla`, TRL `_compute_loss`):
* The log-ratio is clamped to [-20, 20] before `exp` (verl). Positions with mask 0 are replaced by 0 before
  any arithmetic, so garbage (even inf/NaN) in padding never reaches the loss or its gradient.
* Clip fractions follow TRL: `clip_frac_high` = share of valid tokens with A > 0 and rho > 1 + eps_high,
  `clip_frac_low` = share with A < 0 and rho < 1 - eps_low, `clip_frac` their sum (where the clipped term
  binds).
  verl's `pg_clipfrac_lower` (dual-clip share) is reported here as `pg/dual_clip_frac`.
* `pg/approx_kl` is verl's `ppo_kl`: the token mean of -(logp - old_logp) (k1 estimate of KL(old || new)).
* Metric keys are slash-namespaced (`pg/clip_frac`, not the issue's bare `clip_frac`), per the house style.
* ratio_level="sequence" is TRL's GSPO option: rho_i = exp(mean_t m (logp - old_logp)), shared by all tokens
  of sequence i.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses import aggregation

_MAX_LOG_RATIO = 20.0
_RATIO_LEVELS = ("token", "sequence")


@dataclasses.dataclass(frozen=True)
class ClipConfig:
    """Clip bounds of the surrogate. GRPO/verl defaults; DAPO clip-higher is `ClipConfig(0.2, 0.28, 10.0)`.

    clip_low: eps_low, ratio floor 1 - eps_low (binds where A < 0). clip_high: eps_high, ratio ceiling
    1 + eps_high (binds where A > 0). dual_clip: c of dual-clip PPO (Ye et al., arXiv:1912.09729), None = off.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None

    def __post_init__(self):
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"ClipConfig.clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0.0:
            raise ValueError(f"ClipConfig.clip_high must be >= 0, got {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"ClipConfig.dual_clip must be > 1 or None, got {self.dual_clip}")


def _broadcast_BT(x, shape_BT: tuple[int, int], name: str) -> chex.Array:
    """Scalar, [B] or [B, T] -> [B, T]."""
    x = jnp.asarray(x)
    if x.ndim == 0:
        return jnp.broadcast_to(x, shape_BT)
    if x.shape == shape_BT[:1]:
        return jnp.broadcast_to(x[:, None], shape_BT)
    if x.shape == shape_BT:
        return x
    raise ValueError(f"{name} must be a scalar, [B]={shape_BT[:1]} or [B, T]={shape_BT}; got shape {x.shape}")


def _check_scalar_bounds(clip_low, clip_high, dual_clip) -> None:
    if jnp.ndim(clip_low) == 0 and isinstance(clip_low, (int, float)) and not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if jnp.ndim(clip_high) == 0 and isinstance(clip_high, (int, float)) and clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 or None, got {dual_clip}")


def log_ratio(
    logp_BT: chex.Array, old_logp_BT: chex.Array, mask_BT: chex.Array, *, ratio_level: str = "token"
) -> chex.Array:
    """Clamped log importance ratio log(pi/pi_old), per token or per sequence (GSPO), broadcast to [B, T]."""
    if ratio_level not in _RATIO_LEVELS:
        raise ValueError(f"ratio_level must be one of {_RATIO_LEVELS}, got {ratio_level!r}")
    m_BT = mask_BT.astype(bool)
    diff_BT = jnp.where(m_BT, logp_BT - old_logp_BT, 0.0)
    if ratio_level == "sequence":
        len_B = jnp.maximum(jnp.sum(m_BT, axis=1), 1).astype(diff_BT.dtype)
        diff_BT = jnp.broadcast_to((jnp.sum(diff_BT, axis=1) / len_B)[:, None], diff_BT.shape)
    return jnp.clip(diff_BT, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def clipped_objective(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    advantages: chex.Array,
    mask_BT: chex.Array,
    *,
    clip_low=0.2,
    clip_high=0.2,
    dual_clip: float | None = None,
    ratio_level: str = "token",
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Per-token clipped importance-ratio surrogate of PPO/GRPO, to be minimised (unaggregated).

    rho_it = exp(clamp(logp_it - old_logp_it, -20, 20))
    l_it   = max(-A_it rho_it, -A_it clip(rho_it, 1 - eps_low, 1 + eps_high))
    dual clip, only where A_it < 0:  l_it <- min(l_it, -A_it c)
    PPO: Schulman et al., arXiv:1707.06347; GRPO: Shao et al., arXiv:2402.03300; clip-higher
    (eps_high > eps_low): DAPO, arXiv:2503.14476; dual clip: Ye et al., arXiv:1912.09729; GSPO sequence ratio:
    Zheng et al., arXiv:2507.18071. Symbols: eps_low = `clip_low`, eps_high = `clip_high`, c = `dual_clip`
    (verl clip_ratio_c).

    Args:
      logp_BT: [B, T] float log-probs of the sampled tokens under the current policy (differentiated).
      old_logp_BT: [B, T] float log-probs under the behaviour policy (treated as constant).
      advantages: [B] per-sequence or [B, T] per-token advantages (treated as constant).
      mask_BT: [B, T] mask, 1 = token trained on.
      clip_low, clip_high: scalars, [B] or [B, T] arrays (per-sample bounds, e.g. ETR).
      dual_clip: c > 1 or None.
      ratio_level: "token" (PPO/GRPO) or "sequence" (GSPO).

    Returns:
      (l_BT [B, T] per-token losses, 0 at masked positions; metrics `pg/clip_frac`, `pg/clip_frac_low`,
      `pg/clip_frac_high`, `pg/dual_clip_frac`, `pg/approx_kl`, `pg/ratio_mean`, `pg/ratio_max` (token means
      over this batch's mask)). Aggregate with `aggregation.aggregate` (or call `policy_loss`).
    """
    chex.assert_rank([logp_BT, old_logp_BT, mask_BT], 2)
    chex.assert_equal_shape([logp_BT, old_logp_BT, mask_BT])
    chex.assert_type([logp_BT, old_logp_BT], float)
    _check_scalar_bounds(clip_low, clip_high, dual_clip)
    shape_BT = logp_BT.shape
    adv_BT = jax.lax.stop_gradient(_broadcast_BT(advantages, shape_BT, "advantages"))
    eps_low_BT = _broadcast_BT(clip_low, shape_BT, "clip_low")
    eps_high_BT = _broadcast_BT(clip_high, shape_BT, "clip_high")
    old_logp_BT = jax.lax.stop_gradient(old_logp_BT)

    log_ratio_BT = log_ratio(logp_BT, old_logp_BT, mask_BT, ratio_level=ratio_level)
    ratio_BT = jnp.exp(log_ratio_BT)
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - eps_low_BT, 1.0 + eps_high_BT)
    loss_BT = jnp.maximum(unclipped_BT, clipped_BT)
    dual_BT = jnp.zeros(shape_BT, bool)
    if dual_clip is not None:
        cap_BT = -adv_BT * dual_clip
        dual_BT = (adv_BT < 0) & (loss_BT > cap_BT)
        loss_BT = jnp.where(adv_BT < 0, jnp.minimum(loss_BT, cap_BT), loss_BT)
    valid_BT = mask_BT.astype(bool)
    loss_BT = jnp.where(valid_BT, loss_BT, 0.0)

    mean = lambda x_BT: aggregation.masked_mean(jax.lax.stop_gradient(x_BT).astype(jnp.float32), mask_BT)
    high_BT = (adv_BT > 0) & (ratio_BT > 1.0 + eps_high_BT)
    low_BT = (adv_BT < 0) & (ratio_BT < 1.0 - eps_low_BT)
    metrics = {
        "pg/clip_frac": mean(high_BT | low_BT),
        "pg/clip_frac_low": mean(low_BT),
        "pg/clip_frac_high": mean(high_BT),
        "pg/dual_clip_frac": mean(dual_BT),
        "pg/approx_kl": mean(-log_ratio_BT),
        "pg/ratio_mean": mean(ratio_BT),
        "pg/ratio_max": jnp.max(jnp.where(valid_BT, jax.lax.stop_gradient(ratio_BT), 0.0)),
    }
    return loss_BT, metrics


def policy_loss(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    advantages: chex.Array,
    mask_BT: chex.Array,
    *,
    clip_low=0.2,
    clip_high=0.2,
    dual_clip: float | None = None,
    agg: "aggregation.AggMode | str" = "token-mean",
    ratio_level: str = "token",
    horizon: int | float | None = None,
    normalizer: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """`clipped_objective` aggregated: loss = aggregate(l, m, agg) (a convenience for users; the train step
    sums its per-token terms and aggregates once).

    Args: as `clipped_objective`, plus `agg`, `horizon`, `normalizer` of `aggregation.aggregate`.

    Returns:
      (loss scalar, metrics of `clipped_objective` plus `pg/loss`).
    """
    loss_BT, metrics = clipped_objective(logp_BT, old_logp_BT, advantages, mask_BT, clip_low=clip_low,
                                         clip_high=clip_high, dual_clip=dual_clip, ratio_level=ratio_level)
    loss = aggregation.aggregate(loss_BT, mask_BT, agg, horizon=horizon, normalizer=normalizer)
    return loss, {"pg/loss": jax.lax.stop_gradient(loss), **metrics}


def entropy_bonus(
    entropy_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    coef: float,
    agg: "aggregation.AggMode | str" = "token-mean",
    horizon: int | float | None = None,
    normalizer: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Entropy regulariser to *add* to the loss: -coef * aggregate(H, m, agg) (verl `entropy_coeff`).

    Args:
      entropy_BT: [B, T] per-token policy entropy H_it.
      mask_BT: [B, T] mask.
      coef: lambda_H >= 0 (0 disables the term but still reports the metric).
      agg, horizon, normalizer: as in `aggregation.aggregate`.

    Returns:
      (loss term scalar, {"entropy/mean": token-mean entropy, "entropy/loss": the term}).
    """
    chex.assert_rank([entropy_BT, mask_BT], 2)
    chex.assert_equal_shape([entropy_BT, mask_BT])
    term = -coef * aggregation.aggregate(entropy_BT, mask_BT, agg, horizon=horizon, normalizer=normalizer)
    metrics = {
        "entropy/mean": aggregation.masked_mean(jax.lax.stop_gradient(entropy_BT), mask_BT),
        "entropy/loss": jax.lax.stop_gradient(term),
    }
    return term, metrics
