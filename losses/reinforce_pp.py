"""REINFORCE++ and REINFORCE++-baseline: critic-free advantages whitened over the batch's response tokens.

Hu et al., "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and Reward Models",
arXiv:2501.03262. Reference: verl `core_algos.py::compute_reinforce_plus_plus_outcome_advantage` and
`compute_reinforce_plus_plus_baseline_outcome_advantage`, with `verl.utils.torch_functional.masked_whiten`.

With the outcome reward R_i at the last response token of row i, m_it the response mask and
n_it = Σ_{t' > t} m_it' the trained tokens after t:

  REINFORCE++           G_it = γ^{n_it} R_i                      (discounted return of the last-token reward)
                        A_it = m_it · whiten_m(G)_it
  REINFORCE++-baseline  b_i  = R_i − mean_{j in g(i)} R_j        (group of one: b_i = R_i, verl's rule)
                        A_it = m_it · whiten_m(b_i m_it)_it

  whiten_m(x) = (x − μ) / sqrt(σ² + 1e-8),   μ, σ² (unbiased) taken over every masked token of the batch

so a long response weighs more in μ and σ than a short one (token-level statistics, as verl). γ: verl
`algorithm.gamma` (default 1, where G_it = R_i on every token).

Choices and deviations from verl:
* The reward is a scalar per row. A KL penalty in the reward (`algorithm.kl.where: reward`) arrives as the
  row's summed KL, i.e. at the last token; verl's REINFORCE++ recipes put −β·kl_t on each token t, so the
  return of token t there holds only the KL of tokens t.. . With γ = 1 and no KL both forms are identical.
* Holes in the mask (tool observations of a multi-turn episode) are skipped by the discount: n_it counts
  trained tokens only. verl's loop multiplies its running return by the mask, which zeroes the return of
  every token before a hole.
* `nan_aware`: rows whose reward is NaN (a reward that failed with `on_error: skip`) are left out of the group
  means and the whitening statistics and get advantage 0 (TRL's semantics for GRPO; verl has no NaN rule).
* A group whose rewards are all equal centres to exactly 0 (`group_advantages`); whitening then shifts it by
  the batch mean like every other row.
* Fewer than two masked tokens: variance 0, as `masked_whiten` (verl raises).
"""

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses.advantages import _check_rewards, group_advantages
from jaxrl.losses.gdpo import masked_whiten


def _check(rewards_B: chex.Array, mask_BT: chex.Array) -> None:
    chex.assert_rank([rewards_B, mask_BT], [1, 2])
    chex.assert_equal_shape_prefix([rewards_B, mask_BT], 1)


def _whiten(values_BT: chex.Array, mask_BT: chex.Array) -> chex.Array:
    m_BT = mask_BT.astype(bool)
    return jnp.where(m_BT, masked_whiten(jnp.where(m_BT, values_BT, 0.0), m_BT), 0.0)


def reinforce_pp_advantages(
    rewards_B: chex.Array, mask_BT: chex.Array, *, gamma: float = 1.0, nan_aware: bool = False
) -> chex.Array:
    """REINFORCE++ advantages (module docstring): discounted return of the last-token reward, whitened.

    Args:
      rewards_B: [B] float outcome rewards, one per row.
      mask_BT: [B, T] response mask (1 = trained token).
      gamma: discount γ in [0, 1] per trained token (verl `algorithm.gamma`, default 1).
      nan_aware: NaN rewards leave the statistics and get advantage 0.

    Returns:
      [B, T] advantages, 0 at masked positions.
    """
    _check(rewards_B, mask_BT)
    _check_rewards(rewards_B, 1)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"reinforce_pp_advantages: gamma must be in [0, 1], got {gamma}")
    valid_B = ~jnp.isnan(rewards_B) if nan_aware else jnp.ones(rewards_B.shape, bool)
    m_BT = mask_BT.astype(bool) & valid_B[:, None]
    m_f = m_BT.astype(rewards_B.dtype)
    after_BT = jnp.cumsum(m_f[:, ::-1], axis=1)[:, ::-1] - m_f  # trained tokens after t
    r_B = jnp.where(valid_B, rewards_B, 0.0)
    returns_BT = r_B[:, None] * jnp.power(jnp.asarray(gamma, rewards_B.dtype), after_BT)
    return jax.lax.stop_gradient(_whiten(returns_BT, m_BT))


def reinforce_pp_baseline_advantages(
    rewards_B: chex.Array, group_size: int, mask_BT: chex.Array, *, nan_aware: bool = False
) -> chex.Array:
    """REINFORCE++-baseline advantages (module docstring): group-mean baseline, then batch whitening.

    Args:
      rewards_B: [B] float rewards, N = P * group_size, groups contiguous.
      group_size: G (1: no baseline, b_i = R_i).
      mask_BT: [B, T] response mask.
      nan_aware: NaN rewards leave the group means and the whitening statistics and get advantage 0.

    Returns:
      [B, T] advantages, 0 at masked positions.
    """
    _check(rewards_B, mask_BT)
    b_B = group_advantages(rewards_B, group_size, scale="none", nan_aware=nan_aware)
    valid_B = ~jnp.isnan(rewards_B) if nan_aware else jnp.ones(rewards_B.shape, bool)
    m_BT = mask_BT.astype(bool) & valid_B[:, None]
    return jax.lax.stop_gradient(_whiten(jnp.broadcast_to(b_B[:, None], m_BT.shape), m_BT))
