"""GDPO and GD2PO: multi-reward advantages normalised per reward before they are combined.

GDPO (Liu et al., NVIDIA, arXiv:2601.05242), TRL / NVlabs semantics (`gdpo_advantages`):
  A_i^(k) = (r_i^(k) - mean_g r^(k)) / (std_g r^(k) + eps)      per reward k, per group, unbiased std
  P_i     = sum_k w_k A_i^(k)
  A_i     = (P_i - mean_B P) / (std_B P + eps)                  one standardisation over all samples
verl variant (NVlabs verl-GDPO; `gdpo_token_advantages`): sum of per-reward GRPO advantages broadcast to
tokens, then `masked_whiten` over all response tokens of the batch (token-weighted mean and Bessel-corrected
variance, (x - mu) / sqrt(var + 1e-8)), times the mask.

GD2PO (arXiv:2606.16771, `gd2po_advantages`), per sample with S_i^(k) = sum_t m_it A_i^(k) (token-summed):
  conflict_i = (exists k: S_i^(k) > 1e-8) and (exists k': S_i^(k') < -1e-8)
  s_i        = sum_k S_i^(k) / (sum_k |S_i^(k)| + eps_snr)
  keep_i     = not conflict_i                       ("hard")
             = not (conflict_i and |s_i| < tau)     ("snr")
  rho_g      = mean_{j in g} keep_j
  A~_i       = rho_g(i) keep_i sum_k A_i^(k)
  A_it       = masked_whiten(A~, keep_i m_it) keep_i m_it

Choices: reward weights are honoured by every function (the verl code sums unweighted; weights=None is that).
The NVlabs fork replaces NaN rewards by 0 before GDPO; here rewards must be finite (apply `jnp.nan_to_num`).
`masked_whiten` with fewer than 2 valid tokens uses variance 0 (verl raises).
"""

import chex
import jax.numpy as jnp

from jaxrl.losses.advantages import _check_rewards, group_advantages

_WHITEN_EPS = 1e-8
_SIGN_TOL = 1e-8


def _per_reward_advantages(rewards_BR: chex.Array, group_size: int, eps: float) -> chex.Array:
    chex.assert_rank(rewards_BR, 2)
    _check_rewards(rewards_BR[:, 0], group_size)
    return jnp.stack(
        [group_advantages(rewards_BR[:, k], group_size, eps=eps) for k in range(rewards_BR.shape[1])], axis=1
    )


def _weights(weights, num_rewards: int) -> chex.Array:
    if weights is None:
        return jnp.ones((num_rewards,), jnp.float32)
    w_R = jnp.asarray(weights, jnp.float32)
    if w_R.shape != (num_rewards,):
        raise ValueError(f"weights must have shape ({num_rewards},) (one per reward), got {w_R.shape}")
    return w_R


def masked_whiten(values_BT: chex.Array, mask_BT: chex.Array, *, eps: float = _WHITEN_EPS) -> chex.Array:
    """verl `masked_whiten`: (x - mu) / sqrt(var + eps), mu and var token-weighted over the mask, var
    unbiased.

    Not multiplied by the mask (padded positions hold finite garbage).
    """
    chex.assert_equal_shape([values_BT, mask_BT])
    m_BT = mask_BT.astype(values_BT.dtype)
    n = jnp.sum(m_BT)
    mean = jnp.sum(values_BT * m_BT) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.square(values_BT - mean) * m_BT) / jnp.maximum(n, 1.0)
    var = jnp.where(n > 1, var * n / jnp.maximum(n - 1.0, 1.0), 0.0)
    return (values_BT - mean) / jnp.sqrt(var + eps)


def gdpo_advantages(
    rewards_BR: chex.Array, group_size: int, *, weights=None, eps: float = 1e-6
) -> chex.Array:
    """GDPO advantages, TRL / NVlabs semantics (module docstring).

    Args:
      rewards_BR: [B, R] float rewards, groups of `group_size` contiguous, finite.
      group_size: G.
      weights: [R] reward weights w_k (default all 1).
      eps: added to both stds (TRL 1e-4; 1e-6 here, like verl).

    Returns:
      [B] advantages.
    """
    a_BR = _per_reward_advantages(rewards_BR, group_size, eps)
    p_B = a_BR @ _weights(weights, a_BR.shape[1]).astype(a_BR.dtype)
    return (p_B - jnp.mean(p_B)) / (jnp.std(p_B, ddof=1) + eps)


def gdpo_token_advantages(
    rewards_BR: chex.Array, group_size: int, mask_BT: chex.Array, *, weights=None, eps: float = 1e-6
) -> chex.Array:
    """GDPO, verl variant: weighted sum of per-reward GRPO advantages, token-weighted `masked_whiten`, x mask.

    Args:
      rewards_BR: [B, R] rewards.  group_size: G.  mask_BT: [B, T] response mask.
      weights: [R] (default 1, the verl code's unweighted sum).  eps: GRPO eps per reward (verl 1e-6).

    Returns:
      [B, T] per-token advantages (0 on padding).
    """
    chex.assert_rank(mask_BT, 2)
    chex.assert_equal_shape_prefix([rewards_BR, mask_BT], 1)
    a_BR = _per_reward_advantages(rewards_BR, group_size, eps)
    p_B = a_BR @ _weights(weights, a_BR.shape[1]).astype(a_BR.dtype)
    m_BT = mask_BT.astype(p_B.dtype)
    return masked_whiten(p_B[:, None] * m_BT, mask_BT) * m_BT


def gd2po_advantages(
    rewards_BR: chex.Array,
    group_size: int,
    mask_BT: chex.Array,
    *,
    mode: str = "hard",
    tau: float = 0.2,
    weights=None,
    eps: float = 1e-6,
    eps_snr: float = 1e-6,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """GD2PO conflict-filtered, consensus-scaled GDPO advantages (module docstring).

    Args:
      rewards_BR: [B, R] rewards, groups of `group_size` contiguous.  mask_BT: [B, T] response mask.
      mode: "hard" (drop every conflicting sample) or "snr" (drop conflicting samples with |s_i| < tau).
      tau: SNR threshold in [0, 1] (code default 0.2, scripts 0.8).
      weights: [R] weights of the per-reward advantages in the sum (default 1, as the reference code).
      eps: GRPO eps per reward (1e-6).
      eps_snr: eps_s of the SNR ratio (1e-8 tool-calling, 1e-6 safe-alignment).

    Returns:
      ([B, T] advantages, metrics {"gd2po/keep_frac", "gd2po/conflict_frac"}).
    """
    if mode not in ("hard", "snr"):
        raise ValueError(f"mode must be 'hard' or 'snr', got {mode!r}")
    if not eps_snr > 0:
        raise ValueError(f"gd2po_advantages: eps_snr must be > 0, got {eps_snr}")
    chex.assert_rank(mask_BT, 2)
    chex.assert_equal_shape_prefix([rewards_BR, mask_BT], 1)
    a_BR = _per_reward_advantages(rewards_BR, group_size, eps) * _weights(weights, rewards_BR.shape[1])
    m_BT = mask_BT.astype(a_BR.dtype)
    s_BR = a_BR * jnp.sum(m_BT, axis=1, keepdims=True)  # token-summed per-reward advantages
    conflict_B = jnp.any(s_BR > _SIGN_TOL, axis=1) & jnp.any(s_BR < -_SIGN_TOL, axis=1)
    if mode == "hard":
        keep_B = ~conflict_B
    else:
        snr_B = jnp.sum(s_BR, axis=1) / (jnp.sum(jnp.abs(s_BR), axis=1) + eps_snr)
        keep_B = ~(conflict_B & (jnp.abs(snr_B) < tau))
    keep_f_B = keep_B.astype(a_BR.dtype)
    ratio_B = jnp.repeat(jnp.mean(keep_f_B.reshape(-1, group_size), axis=1), group_size)
    scaled_B = ratio_B * keep_f_B * jnp.sum(a_BR, axis=1)
    keep_m_BT = keep_f_B[:, None] * m_BT
    adv_BT = masked_whiten(scaled_B[:, None] * m_BT, keep_m_BT) * keep_m_BT
    metrics = {
        "gd2po/keep_frac": jnp.mean(keep_f_B),
        "gd2po/conflict_frac": jnp.mean(conflict_B.astype(jnp.float32)),
    }
    return adv_BT, metrics
