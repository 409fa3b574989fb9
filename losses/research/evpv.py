"""EVPV-PRM: reliability-gated step rewards and Best-of-N step-score aggregators.

"Explicit visual premise verification for multimodal PRMs" (EVPV-PRM), arXiv:2603.16253
(reference: Qwen-Applications/EVPV-PRM, ``evpv_prm/evpv_prm_inference.py`` stage 3 gating,
``evpv_prm/compute_bon_metrics.py`` aggregators).

Premise reliability from the judge's contradiction counts, and the gate on step rewards r_t ∈ {+1, −1}::

    p   = max(0, 1 − 0.5·n_high − 0.2·n_low)
    r̃_t = p · r_t   if t ∈ V (visually dependent step) and r_t = +1;   r̃_t = r_t otherwise

Aggregators over the T valid steps of a response (t = 1..T; empty response → 0)::

    correctness rate   #{t : s_t = 1} / T
    position-weighted  (Σ_t t·s_t + W) / (2W),  W = T(T+1)/2
    streak             (S + T) / (W + T),  S = Σ_t [run_t if s_t = 1 else −1], run_t = current run of 1s
    geometric mean     (Π_t g_t)^(1/T),  g_t = 1 if s_t = 1 else 0.1
    first error        (index of the first s_t = −1, 0-based) / T, or 1 if there is none

Symbol mapping: V = ``visual_mask``, n_high / n_low = direct contradictions of high / low severity.

Deviations from the reference:
- Batched ``[B, T]`` arrays with a right-padded ``step_mask_BT`` (responses with different step counts);
  1-D inputs are accepted and give 1-D / scalar outputs.
- Tests of ``s_t = 1`` / ``s_t = −1`` are exact float comparisons as in the reference, so gated scores
  such as 0.6 count neither as correct nor as an error (the reference BoN script reads the *ungated*
  ``raw_step_scores``).
- A non-finite p, or one outside [0, 1], is treated as unparsable: p = 0 ("invalid p → 0").
"""

import chex
import jax
import jax.numpy as jnp


def _batched(fn):
    """Lift a ``[B, T]`` function so that 1-D ``[T]`` inputs work too (leading axis added and removed)."""

    def wrapper(scores, *args, **kwargs):
        if scores.ndim == 1:
            args = tuple(None if a is None else jnp.asarray(a)[None] for a in args)
            kwargs = {k: None if v is None else jnp.asarray(v)[None] for k, v in kwargs.items()}
            return fn(scores[None], *args, **kwargs)[0]
        return fn(scores, *args, **kwargs)

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _mask(scores_BT, step_mask_BT):
    chex.assert_rank(scores_BT, 2)
    if step_mask_BT is None:
        return jnp.ones(scores_BT.shape, bool)
    chex.assert_equal_shape([scores_BT, step_mask_BT])
    return step_mask_BT.astype(bool)


def premise_reliability(n_high: jax.Array, n_low: jax.Array) -> jax.Array:
    """p = max(0, 1 − 0.5·n_high − 0.2·n_low), elementwise, float32."""
    n_high = jnp.asarray(n_high, jnp.float32)
    n_low = jnp.asarray(n_low, jnp.float32)
    chex.assert_equal_shape([n_high, n_low])
    return jnp.maximum(0.0, 1.0 - 0.5 * n_high - 0.2 * n_low)


def gate_step_rewards(
    r_BT: jax.Array, visual_mask_BT: jax.Array, p_B: jax.Array, step_mask_BT: jax.Array | None = None
) -> jax.Array:
    """r̃ = p·r on visually dependent correct steps, r elsewhere; padded steps are 0.

    Also accepts ``[T]`` inputs with a scalar p.
    """
    if r_BT.ndim == 1:
        mask = None if step_mask_BT is None else step_mask_BT[None]
        return gate_step_rewards(r_BT[None], visual_mask_BT[None], jnp.reshape(p_B, (1,)), mask)[0]
    chex.assert_rank([r_BT, visual_mask_BT, p_B], [2, 2, 1])
    chex.assert_equal_shape([r_BT, visual_mask_BT])
    chex.assert_equal_shape_prefix([r_BT, p_B], 1)
    m_BT = _mask(r_BT, step_mask_BT)
    p_B = p_B.astype(jnp.float32)
    p_B = jnp.where(jnp.isfinite(p_B) & (p_B >= 0.0) & (p_B <= 1.0), p_B, 0.0)
    r_BT = r_BT.astype(jnp.float32)
    gated_BT = jnp.where(visual_mask_BT.astype(bool) & (r_BT == 1.0), p_B[:, None] * r_BT, r_BT)
    return jnp.where(m_BT, gated_BT, 0.0)


def _count(m_BT):
    return m_BT.sum(-1).astype(jnp.float32)


@_batched
def correctness_rate(s_BT: jax.Array, step_mask_BT: jax.Array | None = None) -> jax.Array:
    """#{t : s_t = 1} / T per response; 0 for an empty response."""
    m_BT = _mask(s_BT, step_mask_BT)
    n_B = _count(m_BT)
    return jnp.where(n_B > 0, (m_BT & (s_BT == 1)).sum(-1) / jnp.maximum(n_B, 1.0), 0.0)


@_batched
def position_weighted(s_BT: jax.Array, step_mask_BT: jax.Array | None = None) -> jax.Array:
    """(Σ_t t·s_t + W) / (2W), W = T(T+1)/2, t = 1..T; 0 for an empty response."""
    m_BT = _mask(s_BT, step_mask_BT)
    n_B = _count(m_BT)
    t_T = jnp.arange(1, s_BT.shape[-1] + 1, dtype=jnp.float32)
    weighted_B = jnp.where(m_BT, t_T * s_BT.astype(jnp.float32), 0.0).sum(-1)
    w_B = n_B * (n_B + 1.0) / 2.0
    return jnp.where(n_B > 0, (weighted_B + w_B) / jnp.maximum(2.0 * w_B, 1.0), 0.0)


@_batched
def streak_score(s_BT: jax.Array, step_mask_BT: jax.Array | None = None) -> jax.Array:
    """(S + T) / (T(T+1)/2 + T) with S = Σ_t (current run of correct steps if s_t = 1 else −1)."""
    m_BT = _mask(s_BT, step_mask_BT)
    n_B = _count(m_BT)
    ok_BT = m_BT & (s_BT == 1)
    t_T = jnp.arange(1, s_BT.shape[-1] + 1)
    last_break_BT = jax.lax.cummax(jnp.where(ok_BT, 0, t_T), axis=1)
    run_BT = jnp.where(ok_BT, t_T - last_break_BT, 0)
    total_B = jnp.where(m_BT, jnp.where(ok_BT, run_BT, -1), 0).sum(-1).astype(jnp.float32)
    denom_B = n_B * (n_B + 1.0) / 2.0 + n_B
    return jnp.where(n_B > 0, (total_B + n_B) / jnp.maximum(denom_B, 1.0), 0.0)


@_batched
def geometric_mean(s_BT: jax.Array, step_mask_BT: jax.Array | None = None) -> jax.Array:
    """(Π_t g_t)^(1/T), g_t = 1 if s_t = 1 else 0.1; 0 for an empty response."""
    m_BT = _mask(s_BT, step_mask_BT)
    n_B = _count(m_BT)
    log_g_BT = jnp.where(m_BT & (s_BT != 1), jnp.log(0.1), 0.0)
    return jnp.where(n_B > 0, jnp.exp(log_g_BT.sum(-1) / jnp.maximum(n_B, 1.0)), 0.0)


@_batched
def first_error_position(s_BT: jax.Array, step_mask_BT: jax.Array | None = None) -> jax.Array:
    """(0-based index of the first s_t = −1) / T, 1 when no step is −1, 0 for an empty response."""
    m_BT = _mask(s_BT, step_mask_BT)
    n_B = _count(m_BT)
    err_BT = m_BT & (s_BT == -1)
    first_B = jnp.argmax(err_BT, axis=-1).astype(jnp.float32)
    pos_B = jnp.where(err_BT.any(-1), first_B / jnp.maximum(n_B, 1.0), 1.0)
    return jnp.where(n_B > 0, pos_B, 0.0)


AGGREGATORS = {
    "correctness_rate": correctness_rate,
    "position_weighted": position_weighted,
    "streak": streak_score,
    "geometric_mean": geometric_mean,
    "first_error": first_error_position,
}
