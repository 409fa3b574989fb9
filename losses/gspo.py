"""GSPO and GSPO-token: clipped surrogate on the length-normalised sequence importance ratio.

    log s_i = Σ_t m_it (ℓp_it − ℓp^old_it) / max(L_i, 1)          (geometric mean of the token ratios)
    GSPO:        l_it = max(−A_it s_i, −A_it clip(s_i, 1 − ε_low, 1 + ε_high))     (every valid token of i)
    GSPO-token:  s_it = sg[s_i] · exp(ℓp_it − sg[ℓp_it])    (value s_i; ∂s_it/∂ℓp_it = s_i, no cross-token)
                 l_it = max(−A_it s_it, −A_it clip(s_it, 1 − ε_low, 1 + ε_high))

Zheng et al. (Qwen), "Group Sequence Policy Optimization", arXiv:2507.18071. Symbols: ε_low = `clip_low`,
ε_high = `clip_high` (paper v2 §5.1: 3e-4 / 4e-4, the defaults here). The objective of the paper is the mean
over responses of J_i = −l_i: aggregate with "seq-mean-token-mean" (what `gspo_loss` defaults to). With a
per-sequence advantage (A_it = A_i) GSPO and GSPO-token have the same value and the same gradient,
−A_i s_i / L_i per token when unclipped and 0 when the clip binds.

Choices and deviations (references: TRL 1.16 `GRPOTrainer._compute_loss` with
`importance_sampling_level="sequence"`; verl `core_algos.py::compute_policy_loss_gspo`; spec algorithms-2 §1):
* log s_i is clamped at `max_log_ratio` (default 10, verl; no lower clamp, as verl). TRL does not clamp.
* Masked positions are replaced by 0 before any arithmetic, so padding garbage (inf/NaN) never leaks.
* GSPO-token is verl's form (verl always uses it). TRL 1.16 has no GSPO-token: its `sequence_token` level
  lives in `trl/experimental/gspo_token`, which this TRL version does not ship.
* Aggregation is the caller's (house style); verl hard-codes seq-mean-token-mean, TRL applies its
  `loss_type` (the TRL default `dapo` weights each response by its length; `loss_type="grpo"` is GSPO). The
  trainer's default for this objective (`algorithm.agg_mode` unset) is seq-mean-token-mean
  (`jaxrl.learner.objectives.OBJECTIVES`' `agg`).
  Fully masked rows are left out of the sequence mean here and in verl; TRL's "grpo" divides by all B rows.
* Metrics are token-weighted like `grpo.clipped_objective`'s (verl's `pg_clipfrac`); `pg/seq_clip_frac` is
  the fraction of non-empty responses whose ratio is clipped (TRL's `clip_ratio/region_mean` at sequence
  level, when A is per sequence).
"""

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses import aggregation

_DEFAULT_MAX_LOG_RATIO = 10.0


def _check_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT) -> None:
    chex.assert_rank([logp_BT, old_logp_BT, adv_BT, mask_BT], 2)
    chex.assert_equal_shape([logp_BT, old_logp_BT, adv_BT, mask_BT])
    chex.assert_type([logp_BT, old_logp_BT, adv_BT], float)


def _check_bounds(clip_low: float, clip_high: float, max_log_ratio: float) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"gspo: clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"gspo: clip_high must be >= 0, got {clip_high}")
    if max_log_ratio <= 0.0:
        raise ValueError(f"gspo: max_log_ratio must be > 0, got {max_log_ratio}")


def sequence_log_ratio(logp_BT: chex.Array, old_logp_BT: chex.Array, mask_BT: chex.Array) -> chex.Array:
    """log s_i = Σ_t m_it (ℓp_it − ℓp^old_it) / max(L_i, 1), the GSPO log ratio, unclamped.

    Args:
      logp_BT, old_logp_BT: [B, T] float log-probs (current, behaviour).  mask_BT: [B, T] mask.

    Returns:
      [B] float; 0 for a fully masked row.
    """
    chex.assert_rank([logp_BT, old_logp_BT, mask_BT], 2)
    chex.assert_equal_shape([logp_BT, old_logp_BT, mask_BT])
    m_BT = mask_BT.astype(bool)
    diff_BT = jnp.where(m_BT, logp_BT - old_logp_BT, 0.0)
    len_B = jnp.maximum(jnp.sum(m_BT, axis=1), 1).astype(diff_BT.dtype)
    return jnp.sum(diff_BT, axis=1) / len_B


def gspo_objective(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    adv_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    token_level: bool = False,
    max_log_ratio: float = _DEFAULT_MAX_LOG_RATIO,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Per-token GSPO (or GSPO-token) loss, to be minimised, unaggregated (equations: module docstring).

    Args:
      logp_BT: [B, T] float log-probs of the sampled tokens under the current policy (differentiated).
      old_logp_BT: [B, T] float log-probs under the behaviour policy (constant).
      adv_BT: [B, T] float per-token advantages (constant); broadcast a per-sequence A_i over T.
      mask_BT: [B, T] mask, 1 = token trained on.
      clip_low: ε_low, ratio floor 1 − ε_low (binds where A < 0). Paper: 3e-4.
      clip_high: ε_high, ratio ceiling 1 + ε_high (binds where A > 0). Paper: 4e-4.
      token_level: False = GSPO, True = GSPO-token (stop-gradient construction, per-token advantages).
      max_log_ratio: upper clamp of log s (verl 10).

    Returns:
      (loss_BT [B, T], 0 on masked positions; metrics `pg/clip_frac`, `pg/clip_frac_low`, `pg/clip_frac_high`,
      `pg/seq_clip_frac`, `pg/approx_kl`, `pg/ratio_mean`, `pg/ratio_max`). Aggregate with
      `aggregation.aggregate(loss_BT, mask_BT, "seq-mean-token-mean")` for the paper's objective.
    """
    _check_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT)
    _check_bounds(clip_low, clip_high, max_log_ratio)
    adv_BT = jax.lax.stop_gradient(adv_BT)
    old_logp_BT = jax.lax.stop_gradient(old_logp_BT)
    valid_BT = mask_BT.astype(bool)
    log_s_B = sequence_log_ratio(logp_BT, old_logp_BT, mask_BT)
    if token_level:
        safe_logp_BT = jnp.where(valid_BT, logp_BT, 0.0)
        log_s_BT = (jax.lax.stop_gradient(log_s_B)[:, None]
                    + safe_logp_BT - jax.lax.stop_gradient(safe_logp_BT))
    else:
        log_s_BT = jnp.broadcast_to(log_s_B[:, None], logp_BT.shape)
    ratio_BT = jnp.exp(jnp.minimum(log_s_BT, max_log_ratio))
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - clip_low, 1.0 + clip_high)
    loss_BT = jnp.where(valid_BT, jnp.maximum(unclipped_BT, clipped_BT), 0.0)

    ratio_BT = jax.lax.stop_gradient(ratio_BT)
    mean = lambda x_BT: aggregation.masked_mean(x_BT.astype(jnp.float32), mask_BT)
    high_BT = (adv_BT > 0) & (ratio_BT > 1.0 + clip_high)
    low_BT = (adv_BT < 0) & (ratio_BT < 1.0 - clip_low)
    metrics = {
        "pg/clip_frac": mean(high_BT | low_BT),
        "pg/clip_frac_low": mean(low_BT),
        "pg/clip_frac_high": mean(high_BT),
        "pg/seq_clip_frac": aggregation.aggregate((high_BT | low_BT).astype(jnp.float32), mask_BT,
                                                  "seq-mean-token-mean"),
        "pg/approx_kl": mean(-jax.lax.stop_gradient(log_s_BT)),
        "pg/ratio_mean": mean(ratio_BT),
        "pg/ratio_max": jnp.max(jnp.where(valid_BT, ratio_BT, 0.0)),
    }
    return loss_BT, metrics


def gspo_loss(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    adv_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    token_level: bool = False,
    max_log_ratio: float = _DEFAULT_MAX_LOG_RATIO,
    agg: "aggregation.AggMode | str" = "seq-mean-token-mean",
    normalizer: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """`gspo_objective` aggregated (default seq-mean-token-mean, the paper's mean over responses).

    Args: as `gspo_objective`, plus `agg` and `normalizer` of `aggregation.aggregate`.

    Returns:
      (scalar loss, metrics of `gspo_objective` plus `pg/loss`).
    """
    loss_BT, metrics = gspo_objective(logp_BT, old_logp_BT, adv_BT, mask_BT, clip_low=clip_low,
                                      clip_high=clip_high, token_level=token_level,
                                      max_log_ratio=max_log_ratio)
    loss = aggregation.aggregate(loss_BT, mask_BT, agg, normalizer=normalizer)
    return loss, {"pg/loss": jax.lax.stop_gradient(loss), **metrics}
