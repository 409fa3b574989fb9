"""Aggregation of per-token values into one scalar (verl `loss_agg_mode`).

Every mode is written as  agg = sum_{i,t} m_it v_it w_i / Z  with a per-sequence weight w_i that only depends
on the sequence itself and a scalar normaliser Z that depends on the whole batch:

  token-mean               w_i = 1          Z = sum_{i,t} m_it          (verl default; DAPO; TRL "dapo")
  seq-mean-token-mean      w_i = 1 / L_i    Z = N'                      (original GRPO; TRL "grpo")
  seq-mean-token-sum       w_i = 1          Z = N'
  seq-mean-token-sum-norm  w_i = 1          Z = N' * horizon            (Dr.GRPO, arXiv:2503.20783)

with L_i = sum_t m_it and N' the number of sequences with L_i > 0, so fully masked sequences are left out of
sequence means. Micro-batching: compute `aggregation_normalizer` once on the full (mini-)batch and pass it as
`normalizer=` to each micro-batch; the micro-batch values then sum to the full-batch value exactly.

Deviations from verl:
* verl divides by `count + 1e-8` (and `L_i + 1e-8`); here by `max(count, 1)`, exact for non-empty inputs and 0
  for an all-padding batch.
* seq-mean-token-sum-norm follows verl 0.9 (mean over non-empty sequences of token sums, divided by `horizon`,
  default the padded width T); verl 0.6.1 omitted the mean over sequences. TRL "dr_grpo" divides the token sum
  by B * max_completion_length, i.e. counts empty sequences too.
"""

import enum

import chex
import jax.numpy as jnp


class AggMode(str, enum.Enum):
    """How per-token values are reduced; values are verl's `loss_agg_mode` strings."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"


def as_agg_mode(mode: "AggMode | str") -> AggMode:
    """Parses an `AggMode` or its string value; raises ValueError naming the allowed values."""
    try:
        return AggMode(mode)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in AggMode)
        raise ValueError(f"unknown aggregation mode {mode!r}; allowed: {allowed}") from None


def _check(values_BT: chex.Array, mask_BT: chex.Array) -> None:
    chex.assert_rank(values_BT, 2)
    chex.assert_equal_shape([values_BT, mask_BT])


def aggregation_normalizer(
    mask_BT: chex.Array, mode: "AggMode | str", *, horizon: int | float | None = None
) -> chex.Array:
    """The batch-level divisor Z of `mode` (see module docstring), at least 1.

    Args:
      mask_BT: [B, T] bool/int/float mask, 1 = real token.
      mode: aggregation mode.
      horizon: constant for seq-mean-token-sum-norm; default T (the padded width).

    Returns:
      float32 scalar.
    """
    chex.assert_rank(mask_BT, 2)
    mode = as_agg_mode(mode)
    m_BT = mask_BT.astype(jnp.float32)
    if mode is AggMode.TOKEN_MEAN:
        z = jnp.sum(m_BT)
    else:
        z = jnp.sum(jnp.sum(m_BT, axis=1) > 0).astype(jnp.float32)
        if mode is AggMode.SEQ_MEAN_TOKEN_SUM_NORM:
            z = z * (mask_BT.shape[1] if horizon is None else horizon)
    return jnp.maximum(z, 1.0)


def aggregate(
    values_BT: chex.Array,
    mask_BT: chex.Array,
    mode: "AggMode | str" = AggMode.TOKEN_MEAN,
    *,
    horizon: int | float | None = None,
    normalizer: chex.Numeric | None = None,
) -> chex.Array:
    """Reduces per-token values to a scalar: sum_{i,t} m_it v_it w_i / Z (module docstring).

    Args:
      values_BT: [B, T] float per-token values. Values at masked positions are ignored (even NaN/inf).
      mask_BT: [B, T] mask, 1 = real token.
      mode: an `AggMode` or its string ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
        "seq-mean-token-sum-norm").
      horizon: constant of seq-mean-token-sum-norm (default T); ignored when `normalizer` is given.
      normalizer: global Z from `aggregation_normalizer` on the full batch (micro-batching); default: this
        batch's Z.

    Returns:
      scalar of the dtype of `values_BT` promoted with float32.
    """
    _check(values_BT, mask_BT)
    mode = as_agg_mode(mode)
    m_BT = mask_BT.astype(bool)
    v_BT = jnp.where(m_BT, values_BT, 0.0)
    if mode is AggMode.SEQ_MEAN_TOKEN_MEAN:
        len_B = jnp.sum(m_BT, axis=1).astype(v_BT.dtype)
        total = jnp.sum(jnp.sum(v_BT, axis=1) / jnp.maximum(len_B, 1.0))
    else:
        total = jnp.sum(v_BT)
    if normalizer is None:
        normalizer = aggregation_normalizer(mask_BT, mode, horizon=horizon)
    return total / normalizer


def masked_mean(values_BT: chex.Array, mask_BT: chex.Array) -> chex.Array:
    """Token mean of `values_BT` over `mask_BT` (0 for an all-masked input); used for metrics."""
    return aggregate(values_BT, mask_BT, AggMode.TOKEN_MEAN)
