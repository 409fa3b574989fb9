"""GDPO and GD2PO: multi-reward advantages normalised per reward before they are combined.

GDPO (Liu et al., NVIDIA, arXiv:2601.05242), TRL / NVlabs semantics (`gdpo_advantages`):
  A_i^(k) = (r_i^(k) - mean_g r^(k)) / (std_g r^(k) + eps)      per reward k, per group, unbiased std
  P_i     = sum_k w_k A_i^(k)
  A_i     = (P_i - mean_N P) / (std_N P + eps)                  one standardisation over all samples
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


def _per_reward_advantages(rewards_NK: chex.Array, group_size: int, eps: float) -> chex.Array:
    chex.assert_rank(rewards_NK, 2)
    _check_rewards(rewards_NK[:, 0], group_size)
    return jnp.stack(
        [group_advantages(rewards_NK[:, k], group_size, eps=eps) for k in range(rewards_NK.shape[1])], axis=1
    )


def _weights(weights, num_rewards: int) -> chex.Array:
    if weights is None:
        return jnp.ones((num_rewards,), jnp.float32)
    w_K = jnp.asarray(weights, jnp.float32)
    if w_K.shape != (num_rewards,):
        raise ValueError(f"weights must have shape ({num_rewards},) (one per reward), got {w_K.shape}")
    return w_K


def masked_whiten(values_NT: chex.Array, mask_NT: chex.Array, *, eps: float = _WHITEN_EPS) -> chex.Array:
    """verl `masked_whiten`: (x - mu) / sqrt(var + eps), mu and var token-weighted over the mask, var
    unbiased.

    Not multiplied by the mask (padded positions hold finite garbage).
    """
    chex.assert_equal_shape([values_NT, mask_NT])
    m_NT = mask_NT.astype(values_NT.dtype)
    n = jnp.sum(m_NT)
    mean = jnp.sum(values_NT * m_NT) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.square(values_NT - mean) * m_NT) / jnp.maximum(n, 1.0)
    var = jnp.where(n > 1, var * n / jnp.maximum(n - 1.0, 1.0), 0.0)
    return (values_NT - mean) / jnp.sqrt(var + eps)


def gdpo_advantages(
    rewards_NK: chex.Array, group_size: int, *, weights=None, eps: float = 1e-6
) -> chex.Array:
    """GDPO advantages, TRL / NVlabs semantics (module docstring).

    Args:
      rewards_NK: [N, K] float rewards, groups of `group_size` contiguous, finite.
      group_size: G.
      weights: [K] reward weights w_k (default all 1).
      eps: added to both stds (TRL 1e-4; 1e-6 here, like verl).

    Returns:
      [N] advantages.
    """
    a_NK = _per_reward_advantages(rewards_NK, group_size, eps)
    p_N = a_NK @ _weights(weights, a_NK.shape[1]).astype(a_NK.dtype)
    return (p_N - jnp.mean(p_N)) / (jnp.std(p_N, ddof=1) + eps)


def gdpo_token_advantages(
    rewards_NK: chex.Array, group_size: int, mask_NT: chex.Array, *, weights=None, eps: float = 1e-6
) -> chex.Array:
    """GDPO, verl variant: weighted sum of per-reward GRPO advantages, token-weighted `masked_whiten`, x mask.

    Args:
      rewards_NK: [N, K] rewards.  group_size: G.  mask_NT: [N, T] response mask.
      weights: [K] (default 1, the verl code's unweighted sum).  eps: GRPO eps per reward (verl 1e-6).

    Returns:
      [N, T] per-token advantages (0 on padding).
    """
    chex.assert_rank(mask_NT, 2)
    chex.assert_equal_shape_prefix([rewards_NK, mask_NT], 1)
    a_NK = _per_reward_advantages(rewards_NK, group_size, eps)
    p_N = a_NK @ _weights(weights, a_NK.shape[1]).astype(a_NK.dtype)
    m_NT = mask_NT.astype(p_N.dtype)
    return masked_whiten(p_N[:, None] * m_NT, mask_NT) * m_NT


def gd2po_advantages(
    rewards_NK: chex.Array,
    group_size: int,
    mask_NT: chex.Array,
    *,
    mode: str = "hard",
    tau: float = 0.2,
    weights=None,
    eps: float = 1e-6,
    eps_snr: float = 1e-6,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """GD2PO conflict-filtered, consensus-scaled GDPO advantages (module docstring).

    Args:
      rewards_NK: [N, K] rewards, groups of `group_size` contiguous.  mask_NT: [N, T] response mask.
      mode: "hard" (drop every conflicting sample) or "snr" (drop conflicting samples with |s_i| < tau).
      tau: SNR threshold in [0, 1] (code default 0.2, scripts 0.8).
      weights: [K] weights of the per-reward advantages in the sum (default 1, as the reference code).
      eps: GRPO eps per reward (1e-6).
      eps_snr: eps_s of the SNR ratio (1e-8 tool-calling, 1e-6 safe-alignment).

    Returns:
      ([N, T] advantages, metrics {"gd2po/keep_frac", "gd2po/conflict_frac"}).
    """
    if mode not in ("hard", "snr"):
        raise ValueError(f"mode must be 'hard' or 'snr', got {mode!r}")
    if not eps_snr > 0:
        raise ValueError(f"gd2po_advantages: eps_snr must be > 0, got {eps_snr}")
    chex.assert_rank(mask_NT, 2)
    chex.assert_equal_shape_prefix([rewards_NK, mask_NT], 1)
    a_NK = _per_reward_advantages(rewards_NK, group_size, eps) * _weights(weights, rewards_NK.shape[1])
    m_NT = mask_NT.astype(a_NK.dtype)
    s_NK = a_NK * jnp.sum(m_NT, axis=1, keepdims=True)  # token-summed per-reward advantages
    conflict_N = jnp.any(s_NK > _SIGN_TOL, axis=1) & jnp.any(s_NK < -_SIGN_TOL, axis=1)
    if mode == "hard":
        keep_N = ~conflict_N
    else:
        snr_N = jnp.sum(s_NK, axis=1) / (jnp.sum(jnp.abs(s_NK), axis=1) + eps_snr)
        keep_N = ~(conflict_N & (jnp.abs(snr_N) < tau))
    keep_f_N = keep_N.astype(a_NK.dtype)
    ratio_N = jnp.repeat(jnp.mean(keep_f_N.reshape(-1, group_size), axis=1), group_size)
    scaled_N = ratio_N * keep_f_N * jnp.sum(a_NK, axis=1)
    keep_m_NT = keep_f_N[:, None] * m_NT
    adv_NT = masked_whiten(scaled_N[:, None] * m_NT, keep_m_NT) * keep_m_NT
    metrics = {
        "gd2po/keep_frac": jnp.mean(keep_f_N),
        "gd2po/conflict_frac": jnp.mean(conflict_N.astype(jnp.float32)),
    }
    return adv_NT, metrics
