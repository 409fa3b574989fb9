"""AFRL mode-balanced objective: an RL policy loss plus a supervised NLL on expert targets. [READING]

"Answer First, Reason Later" (AFRL), arXiv:2602.10006. Only the abstract is public: plain RL on the
search-relevance model mode-collapses (reverse KL, mode-seeking); adding an SFT term (forward KL,
mode-covering) keeps the long-tail rules. Our reading of the combination::

    L_SFT = −(1 / Σ_t m*_t) Σ_{b,t} m*_{b,t} log π_θ(y*_{b,t} | x_b, y*_{b,<t})   (token mean)
    L     = L_policy + λ_SFT · L_SFT

Symbol mapping: ``logp_BT`` = log π_θ(y*_t | ·) on expert-labelled (score + rationale) targets,
``mask_BT`` = m*, ``lam`` = λ_SFT (not reported in the abstract).

Deviations / reading notes:
- [READING] The paper's "Stepwise-GRPO" is not defined in the abstract; the policy loss is an input, so the
  per-token advantages (e.g. separate ones for the first score token) stay the caller's choice.
- A batch with no expert token gives L_SFT = 0 (and zero gradient) instead of NaN.
"""

import chex
import jax
import jax.numpy as jnp


def sft_nll(logp_BT: jax.Array, mask_BT: jax.Array, *, normalizer: jax.Array | float | None = None
            ) -> jax.Array:
    """Token-mean NLL −Σ m·logp / max(Σ m, 1) over expert target tokens, in float32.

    Args:
      logp_BT: [B, T] log-probs of the expert tokens.  mask_BT: [B, T] expert-token mask.
      normalizer: the token count to divide by instead of this batch's Σ m (gradient accumulation passes the
        whole mini-batch's count, so micro-batch values add up to the full-batch NLL).
    """
    chex.assert_rank([logp_BT, mask_BT], 2)
    chex.assert_equal_shape([logp_BT, mask_BT])
    m_BT = mask_BT.astype(jnp.float32)
    total = -(jnp.where(m_BT > 0, logp_BT.astype(jnp.float32), 0.0) * m_BT).sum()
    denom = jnp.maximum(m_BT.sum(), 1.0) if normalizer is None else normalizer
    return total / denom


def mode_balanced_loss(
    policy_loss: jax.Array, sft_nll_value: jax.Array, lam: float
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """L = L_policy + λ · L_SFT; returns ``(loss, metrics)`` with ``afrl/{policy_loss,sft_nll,loss}``."""
    chex.assert_rank([policy_loss, sft_nll_value], 0)
    if lam < 0:
        raise ValueError(f"mode_balanced_loss lam={lam}; must be >= 0")
    loss = policy_loss + lam * sft_nll_value
    return loss, {"afrl/policy_loss": policy_loss, "afrl/sft_nll": sft_nll_value, "afrl/loss": loss}
