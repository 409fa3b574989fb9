"""Per-token KL estimators between the policy and a frozen reference (verl `kl_penalty`).

With d_t = logp_t - ref_logp_t (samples drawn from the policy):
  k1  = d                                   (verl "kl")
  k2  = d^2 / 2                             (verl "mse")
  k3  = exp(-d) + d - 1                     (verl "low_var_kl"; unbiased, non-negative)
  abs = |d|
Estimators: J. Schulman, "Approximating KL Divergence" (2020, joschu.net/blog/kl-approx.html); k3 in the loss
as in GRPO, Shao et al., arXiv:2402.03300.

Deviations / choices:
* k3 uses verl's clamps: -d clamped to [-20, 20] before exp, the result clamped to [-10, 10].
* straight_through=True is verl's "k1+"/"k3+"/"abs+": forward value of the estimator, gradient of k2
  (k2 - sg(k2) + sg(kX)); for k2 it changes nothing.
"""

import enum

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses import aggregation


class KLKind(str, enum.Enum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"
    ABS = "abs"


def as_kl_kind(kind: "KLKind | str") -> KLKind:
    try:
        return KLKind(kind)
    except ValueError:
        allowed = ", ".join(repr(k.value) for k in KLKind)
        raise ValueError(f"unknown KL estimator {kind!r}; allowed: {allowed}") from None


def _estimate(d_BT: chex.Array, kind: KLKind) -> chex.Array:
    if kind is KLKind.K1:
        return d_BT
    if kind is KLKind.K2:
        return 0.5 * jnp.square(d_BT)
    if kind is KLKind.ABS:
        return jnp.abs(d_BT)
    neg_d_BT = jnp.clip(-d_BT, -20.0, 20.0)
    return jnp.clip(jnp.exp(neg_d_BT) - neg_d_BT - 1.0, -10.0, 10.0)


def kl_penalty(
    logp_BT: chex.Array, ref_logp_BT: chex.Array, kind: "KLKind | str", *, straight_through: bool = False
) -> chex.Array:
    """Per-token KL estimate of KL(pi || pi_ref) (module docstring for the equations).

    Args:
      logp_BT: [B, T] float log-probs of the sampled tokens under the policy.
      ref_logp_BT: [B, T] float log-probs under the frozen reference (treated as constant).
      kind: "k1", "k2", "k3" or "abs" (or a `KLKind`).
      straight_through: forward value of `kind`, gradient of k2.

    Returns:
      [B, T] per-token estimates (padding is not masked here; aggregate with a mask).
    """
    chex.assert_rank([logp_BT, ref_logp_BT], 2)
    chex.assert_equal_shape([logp_BT, ref_logp_BT])
    chex.assert_type([logp_BT, ref_logp_BT], float)
    kind = as_kl_kind(kind)
    d_BT = logp_BT - jax.lax.stop_gradient(ref_logp_BT)
    value_BT = _estimate(d_BT, kind)
    if straight_through and kind is not KLKind.K2:
        k2_BT = _estimate(d_BT, KLKind.K2)
        value_BT = k2_BT - jax.lax.stop_gradient(k2_BT) + jax.lax.stop_gradient(value_BT)
    return value_BT


def kl_loss(
    logp_BT: chex.Array,
    ref_logp_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    coef: float,
    kind: "KLKind | str" = "k3",
    straight_through: bool = False,
    agg: "aggregation.AggMode | str" = "token-mean",
    horizon: int | float | None = None,
    normalizer: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """KL-in-the-loss term beta * aggregate(k, m, agg) (verl `use_kl_loss`, `kl_loss_coef`; TRL `beta`).

    Args:
      logp_BT, ref_logp_BT: [B, T] log-probs under policy and reference.
      mask_BT: [B, T] mask.
      coef: beta.
      kind, straight_through: as in `kl_penalty` (default k3 = verl `low_var_kl`, TRL).
      agg, horizon, normalizer: as in `aggregation.aggregate`.

    Returns:
      (beta * aggregated KL, {"kl/<kind>": token-mean KL estimate, "kl/loss": the term}).
    """
    chex.assert_equal_shape([logp_BT, mask_BT])
    kind = as_kl_kind(kind)
    kl_BT = kl_penalty(logp_BT, ref_logp_BT, kind, straight_through=straight_through)
    term = coef * aggregation.aggregate(kl_BT, mask_BT, agg, horizon=horizon, normalizer=normalizer)
    metrics = {
        f"kl/{kind.value}": aggregation.masked_mean(jax.lax.stop_gradient(kl_BT), mask_BT),
        "kl/loss": jax.lax.stop_gradient(term),
    }
    return term, metrics
