"""Train–inference mismatch: diagnostics and importance-sampling correction (TIS / MIS, token or sequence).

The sampler (inference engine) and the trainer compute different log-probs for the same tokens, so "on-policy"
rollouts are slightly off-policy. With δ_it = m_it (ℓp_it − ℓq_it) (trainer minus sampler, both after the
sampling temperature):

    token ratio       ρ_it = exp(δ_it)
    sequence ratio    ρ_i  = exp(Σ_t δ_it)               (product, broadcast to the tokens of i; TRL and verl)
    geometric ratio   ρ_i  = exp(Σ_t δ_it / L_i)          (verl Geo-RS / legacy `rollout_is_level=geometric`)
    TIS (truncate):   w = clip(ρ, lower, upper)           keep = m
    MIS (mask):       w = ρ · 1[lower ≤ ρ ≤ upper]         keep = m · 1[lower ≤ ρ ≤ upper]
    per-token loss ← sg[w] · l_it

TIS: Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (blog, 2025,
fengyao.notion.site/off-policy-rl). Sequence-level IS/MIS: Liu, Li et al., "When Speed Kills Stability:
Demystifying RL Collapse from the Training-Inference Mismatch" (blog, 2025). Token MIS with bounds [0.5, 5] is
IcePop (Ring team, arXiv:2510.18855). Symbols: C_min = `lower`, C_max = `upper` (TRL
`vllm_importance_sampling_clip_min/max`, verl `rollout_is_threshold`).

Rejected tokens (MIS), `reject`: `weights_BT` holds 0 for them either way; the caller multiplies the weights
into the per-token policy loss and aggregates every term (policy, KL, entropy) over `keep_BT`.
* "mask" (default, verl `rollout_rs`: rejection sampling): keep_BT = m · 1[inside]. Rejected tokens leave
  every denominator (token-mean count, sequence lengths, the set of non-empty sequences) and the KL and
  entropy terms.
* "zero_weight" (TRL `vllm_importance_sampling_mode=token_mask / sequence_mask`): keep_BT = m. Rejected
  tokens stay in the denominators with policy weight 0 and keep their β·KL and entropy terms.

Choices (references: TRL 1.16 `GRPOTrainer._generate_and_score_completions`, `vllm_importance_sampling_*`;
verl `rollout_corr_helper.py`; spec algorithms-2 §4):
* δ (per token, or the sequence sum/mean) is clamped to ±`max_log_ratio` (20, verl) before exp; TRL does not
  clamp (an overflow there becomes inf, then masked or truncated, with the same result for finite bounds).
* A NaN sampler log-prob (a token the engine could not score) gives δ = 0, ratio 1, as TRL; such tokens are
  left out of the metrics (TRL excludes them from its logp-difference metrics too).
* Defaults are verl's token TIS, C_max = 2 (TRL's default is sequence MIS with C_max = 3).
* Optional `batch_normalize` (verl `rollout_is_batch_normalize`): w ← w / mean(w), the mean over valid tokens
  (token level) or non-empty sequences (sequence levels), skipped when the mean is <= 1e-8.
* Rejection by KL statistics (verl `rollout_rs` k1/k2/k3 options) is not implemented.
"""

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses import aggregation

_LEVELS = ("token", "sequence", "geometric")
_MODES = ("truncate", "mask")
_REJECTS = ("mask", "zero_weight")
_MAX_LOG_RATIO = 20.0
_NORM_EPS = 1e-8


def _token_log_ratio(train_logp_BT, sampler_logp_BT, mask_BT):
    """(δ_BT with NaN and padding -> 0, metrics mask: valid and scorable)."""
    chex.assert_rank([train_logp_BT, sampler_logp_BT, mask_BT], 2)
    chex.assert_equal_shape([train_logp_BT, sampler_logp_BT, mask_BT])
    chex.assert_type([train_logp_BT, sampler_logp_BT], float)
    valid_BT = mask_BT.astype(bool)
    diff_BT = jax.lax.stop_gradient(train_logp_BT - sampler_logp_BT)
    scored_BT = valid_BT & ~jnp.isnan(diff_BT)
    return jnp.where(scored_BT, diff_BT, 0.0), scored_BT


def mismatch_metrics(
    train_logp_BT: chex.Array,
    sampler_logp_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    cap: float = 2.0,
    max_log_ratio: float = _MAX_LOG_RATIO,
) -> dict[str, chex.Array]:
    """Per-step diagnostics of the sampler/trainer log-prob mismatch, over the valid (scorable) tokens.

    |Δ log p| = |ℓp − ℓq|;  ρ = exp(ℓp − ℓq);  k3 = ρ − 1 − log ρ (an estimate of KL(π_sampler ‖ π_trainer)).

    Args:
      train_logp_BT: [B, T] float trainer log-probs of the sampled tokens (ℓp^old, no gradient needed).
      sampler_logp_BT: [B, T] float sampler log-probs (NaN = not scored).
      mask_BT: [B, T] mask, 1 = generated token.
      cap: C > 0 (normally > 1) for the out-of-band fractions (tokens with ρ > C, and with ρ < 1/C).
      max_log_ratio: clamp of the log ratio before exp.

    Returns:
      {"mismatch/abs_logp_diff_mean", "mismatch/abs_logp_diff_max", "mismatch/ratio_max",
       "mismatch/ratio_min",
       "mismatch/frac_above_cap", "mismatch/frac_below_inv_cap", "mismatch/kl" (mean ℓq − ℓp, verl `kl`),
       "mismatch/k3_kl"}: float32 scalars, 0 when no token is valid.
    """
    if not cap > 0.0:
        raise ValueError(f"mismatch_metrics: cap must be > 0, got {cap}")
    diff_BT, scored_BT = _token_log_ratio(train_logp_BT, sampler_logp_BT, mask_BT)
    diff_BT = jnp.clip(diff_BT, -max_log_ratio, max_log_ratio).astype(jnp.float32)
    ratio_BT = jnp.exp(diff_BT)
    mean = lambda x_BT: aggregation.masked_mean(x_BT.astype(jnp.float32), scored_BT)
    any_valid = jnp.any(scored_BT)
    masked_max = lambda x_BT: jnp.where(any_valid, jnp.max(jnp.where(scored_BT, x_BT, -jnp.inf)), 0.0)
    return {
        "mismatch/abs_logp_diff_mean": mean(jnp.abs(diff_BT)),
        "mismatch/abs_logp_diff_max": masked_max(jnp.abs(diff_BT)),
        "mismatch/ratio_max": masked_max(ratio_BT),
        "mismatch/ratio_min": -masked_max(-ratio_BT),
        "mismatch/frac_above_cap": mean(ratio_BT > cap),
        "mismatch/frac_below_inv_cap": mean(ratio_BT < 1.0 / cap),
        "mismatch/kl": mean(-diff_BT),
        "mismatch/k3_kl": mean(ratio_BT - 1.0 - diff_BT),
    }


def rollout_correction(
    train_logp_BT: chex.Array,
    sampler_logp_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    level: str = "token",
    mode: str = "truncate",
    lower: float | None = None,
    upper: float | None = 2.0,
    batch_normalize: bool = False,
    max_log_ratio: float = _MAX_LOG_RATIO,
    reject: str = "mask",
) -> tuple[chex.Array, chex.Array, dict[str, chex.Array]]:
    """TIS / MIS importance weights π_trainer/π_sampler at token or sequence level (module docstring).

    Args:
      train_logp_BT: [B, T] float trainer log-probs ℓp^old of the sampled tokens (treated as constant).
      sampler_logp_BT: [B, T] float sampler log-probs ℓq (NaN = not scored: ratio 1).
      mask_BT: [B, T] mask, 1 = generated token.
      level: "token" (ρ_it), "sequence" (product ρ_i) or "geometric" (exp of the mean δ of sequence i).
      mode: "truncate" (TIS: clip the weight) or "mask" (MIS: zero the tokens / sequences out of the band).
      lower: C_min or None (no lower bound).  upper: C_max or None (no upper bound); at least one is set.
      batch_normalize: divide the weights by their batch mean (verl `rollout_is_batch_normalize`).
      max_log_ratio: clamp of the (token or sequence) log ratio before exp.
      reject: what MIS does with a rejected token besides its weight 0: "mask" (verl: it leaves `keep_BT`)
        or "zero_weight" (TRL: it stays in `keep_BT`). Ignored by TIS.

    Returns:
      (weights_BT [B, T] constant weights (float32; float64 for float64 inputs), 0 at masked and rejected
       positions;
       keep_BT [B, T] bool, the mask to aggregate over: the mask less the rejected tokens (MIS with
       reject="mask"), the mask itself otherwise;
       metrics: those of `mismatch_metrics` (cap = upper, or 2) plus "mismatch/is_weight_mean",
       "mismatch/is_weight_min", "mismatch/is_weight_max" (over valid tokens for level="token", over non-empty
       sequences otherwise), "mismatch/rejected_frac" (share of valid tokens masked out by MIS),
       "mismatch/truncated_frac" (share of valid tokens whose weight TIS changed)).
    """
    if level not in _LEVELS:
        raise ValueError(f"rollout_correction: level={level!r}; allowed: {_LEVELS}")
    if mode not in _MODES:
        raise ValueError(f"rollout_correction: mode={mode!r}; allowed: {_MODES}")
    if reject not in _REJECTS:
        raise ValueError(f"rollout_correction: reject={reject!r}; allowed: {_REJECTS}")
    if lower is None and upper is None:
        raise ValueError("rollout_correction: set at least one of lower, upper (C_min, C_max)")
    if lower is not None and upper is not None and not 0.0 <= lower <= upper:
        raise ValueError(f"rollout_correction: need 0 <= lower <= upper, got lower={lower}, upper={upper}")
    if upper is not None and not upper > 0.0:
        raise ValueError(f"rollout_correction: upper must be > 0, got {upper}")
    diff_BT, _ = _token_log_ratio(train_logp_BT, sampler_logp_BT, mask_BT)
    diff_BT = diff_BT.astype(jnp.promote_types(diff_BT.dtype, jnp.float32))
    valid_BT = mask_BT.astype(bool)
    if level == "token":
        log_rho_BT = diff_BT
    else:
        log_rho_B = jnp.sum(diff_BT, axis=1)
        if level == "geometric":
            log_rho_B = log_rho_B / jnp.maximum(jnp.sum(valid_BT, axis=1), 1).astype(jnp.float32)
        log_rho_BT = jnp.broadcast_to(log_rho_B[:, None], diff_BT.shape)
    rho_BT = jnp.exp(jnp.clip(log_rho_BT, -max_log_ratio, max_log_ratio))
    lo = -jnp.inf if lower is None else lower
    hi = jnp.inf if upper is None else upper
    inside_BT = (rho_BT >= lo) & (rho_BT <= hi)
    if mode == "truncate":
        weights_BT = jnp.clip(rho_BT, lo, hi)
        keep_BT = valid_BT
    else:
        weights_BT = jnp.where(inside_BT, rho_BT, 0.0)
        keep_BT = valid_BT & inside_BT if reject == "mask" else valid_BT
    weights_BT = jnp.where(valid_BT, weights_BT, 0.0)

    rejected_BT = valid_BT & ~inside_BT if mode == "mask" else jnp.zeros_like(inside_BT)
    nonempty_B = jnp.any(valid_BT, axis=1)
    first_BT = (jnp.arange(diff_BT.shape[1]) == 0)[None, :] & nonempty_B[:, None]  # one unit per sequence
    unit_BT = valid_BT if level == "token" else first_BT
    if batch_normalize:
        w_mean = aggregation.masked_mean(weights_BT, unit_BT)
        weights_BT = jnp.where(w_mean > _NORM_EPS, weights_BT / jnp.maximum(w_mean, _NORM_EPS), weights_BT)
    weights_BT = jax.lax.stop_gradient(weights_BT)

    any_unit = jnp.any(unit_BT)
    w_max = jnp.where(any_unit, jnp.max(jnp.where(unit_BT, weights_BT, -jnp.inf)), 0.0)
    w_min = jnp.where(any_unit, jnp.min(jnp.where(unit_BT, weights_BT, jnp.inf)), 0.0)
    metrics = mismatch_metrics(train_logp_BT, sampler_logp_BT, mask_BT, cap=2.0 if upper is None else upper,
                               max_log_ratio=max_log_ratio)
    metrics.update({
        "mismatch/is_weight_mean": aggregation.masked_mean(weights_BT, unit_BT),
        "mismatch/is_weight_min": w_min,
        "mismatch/is_weight_max": w_max,
        "mismatch/rejected_frac": aggregation.masked_mean(rejected_BT.astype(jnp.float32), mask_BT),
        "mismatch/truncated_frac": aggregation.masked_mean(
            (~inside_BT if mode == "truncate" else jnp.zeros_like(inside_BT)).astype(jnp.float32), mask_BT),
    })
    return weights_BT, keep_BT, metrics
