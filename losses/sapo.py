"""SAPO: a smooth sigmoid gate on the token importance ratio in place of PPO's hard clip.

    r_it = exp(ℓp_it − ℓp^old_it)
    τ_it = τ_pos if A_it > 0 else τ_neg
    f(r; τ) = (4/τ) σ(τ (r − 1))                                   σ = logistic sigmoid
    l_it = − f(r_it; τ_it) A_it          ∂l/∂ℓp = − A r sech²(τ (r − 1)/2)   (= −A at r = 1: on-policy PG)

Gao et al. (Qwen), "Soft Adaptive Policy Optimization", arXiv:2511.20347. Symbols: τ_pos, τ_neg = the paper's
temperatures for positive / negative advantages (1.0 / 1.05, both libraries' defaults). The gate weight
sech²(τ(r − 1)/2) is 1 at r = 1 and decays smoothly as the ratio moves away; a larger τ_neg damps negative
updates faster. The loss value at r = 1 is −2A/τ (a constant offset in a logged loss). Reference aggregation:
seq-mean-token-mean (verl hard-codes it; TRL's `sapo` shares its `grpo` normaliser), the trainer's default
for this objective (`algorithm.agg_mode` unset).

Choices (references: TRL 1.16 `GRPOTrainer._compute_loss`, `loss_type="sapo"`; verl
`core_algos.py::compute_policy_loss_sapo`; spec algorithms-2 §3):
* The log ratio is clamped to ±`max_log_ratio` (20, verl) before exp; TRL does not clamp, and an overflowing
  ratio there gives 0 · inf = NaN gradients.
* A = 0 takes τ_neg, as both references (its loss is 0 anyway).
* Token-level ratio only (the paper's form). Masked positions are replaced by 0 before any arithmetic.
* Metrics: `sapo/gate_mean` is the token mean of the gate weight sech²(τ(r − 1)/2) (1 on-policy).
"""

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses import aggregation

_MAX_LOG_RATIO = 20.0


def sapo_objective(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    adv_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    max_log_ratio: float = _MAX_LOG_RATIO,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Per-token SAPO loss, to be minimised, unaggregated (module docstring for the equation).

    Args:
      logp_BT: [B, T] float log-probs of the sampled tokens under the current policy (differentiated).
      old_logp_BT: [B, T] float log-probs under the behaviour policy (constant).
      adv_BT: [B, T] float per-token advantages (constant).
      mask_BT: [B, T] mask, 1 = token trained on.
      tau_pos: τ_pos > 0, gate temperature where A > 0 (paper 1.0).
      tau_neg: τ_neg > 0, gate temperature where A <= 0 (paper 1.05).
      max_log_ratio: the log ratio is clamped to ±max_log_ratio before exp (verl 20).

    Returns:
      (loss_BT [B, T], 0 on masked positions; metrics `sapo/gate_mean`, `pg/approx_kl`, `pg/ratio_mean`,
      `pg/ratio_max`). Aggregate with "seq-mean-token-mean" for the references' objective.
    """
    chex.assert_rank([logp_BT, old_logp_BT, adv_BT, mask_BT], 2)
    chex.assert_equal_shape([logp_BT, old_logp_BT, adv_BT, mask_BT])
    chex.assert_type([logp_BT, old_logp_BT, adv_BT], float)
    if not (tau_pos > 0.0 and tau_neg > 0.0):
        raise ValueError(f"sapo: tau_pos and tau_neg must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    valid_BT = mask_BT.astype(bool)
    adv_BT = jax.lax.stop_gradient(adv_BT)
    log_ratio_BT = jnp.where(valid_BT, logp_BT - jax.lax.stop_gradient(old_logp_BT), 0.0)
    ratio_BT = jnp.exp(jnp.clip(log_ratio_BT, -max_log_ratio, max_log_ratio))
    tau_BT = jnp.where(adv_BT > 0, tau_pos, tau_neg).astype(ratio_BT.dtype)
    gate_BT = (4.0 / tau_BT) * jax.nn.sigmoid(tau_BT * (ratio_BT - 1.0))
    loss_BT = jnp.where(valid_BT, -gate_BT * adv_BT, 0.0)

    ratio_BT = jax.lax.stop_gradient(ratio_BT)
    mean = lambda x_BT: aggregation.masked_mean(x_BT.astype(jnp.float32), mask_BT)
    weight_BT = 1.0 / jnp.square(jnp.cosh(tau_BT * (ratio_BT - 1.0) / 2.0))
    metrics = {
        "sapo/gate_mean": mean(weight_BT),
        "pg/approx_kl": mean(-jax.lax.stop_gradient(log_ratio_BT)),
        "pg/ratio_mean": mean(ratio_BT),
        "pg/ratio_max": jnp.max(jnp.where(valid_BT, ratio_BT, 0.0)),
    }
    return loss_BT, metrics


def sapo_loss(
    logp_BT: chex.Array,
    old_logp_BT: chex.Array,
    adv_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    max_log_ratio: float = _MAX_LOG_RATIO,
    agg: "aggregation.AggMode | str" = "seq-mean-token-mean",
    normalizer: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """`sapo_objective` aggregated (default seq-mean-token-mean, as verl and TRL).

    Args: as `sapo_objective`, plus `agg` and `normalizer` of `aggregation.aggregate`.

    Returns:
      (scalar loss, metrics of `sapo_objective` plus `pg/loss`).
    """
    loss_BT, metrics = sapo_objective(logp_BT, old_logp_BT, adv_BT, mask_BT, tau_pos=tau_pos, tau_neg=tau_neg,
                                      max_log_ratio=max_log_ratio)
    loss = aggregation.aggregate(loss_BT, mask_BT, agg, normalizer=normalizer)
    return loss, {"pg/loss": jax.lax.stop_gradient(loss), **metrics}
