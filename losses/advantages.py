"""Group-relative advantage estimators (GRPO, Dr.GRPO, TRL batch scaling, RLOO) and the DAPO group filter.

Samples are laid out as B = P x G with the G samples of one prompt contiguous (rows `p*G .. p*G+G-1`).

Deviations from / choices against the references:
* `std` is the unbiased (n-1) standard deviation, as torch.std, verl `masked_var(unbiased=True)` and TRL
  `nanstd`.
* Group size 1 follows verl: mu = 0 and sigma = 1, so `A = R / (1 + eps)` ("group"), `A = R` ("none"),
  `A = R / (batch_std + eps)` ("batch").
* `nan_aware=True` follows current TRL for failed rewards: NaN rewards are left out of every mean and std and
  their advantage is forced to 0. A group with a single finite reward then has std 0 (TRL would give NaN) and
  advantage 0.
* A group (of two or more) whose rewards are all equal gets advantage exactly 0, as Tunix. verl and TRL
  compute R - mean in floating point: for rewards not exact in binary (0.7, 1/3) the float32 mean is off by an
  ulp, and dividing that by std + eps (std ~1e-8, eps 1e-6) gave advantages of about ±0.056. GRPO, Dr.GRPO,
  TRL batch scaling, RLOO and (through `group_advantages`) GDPO per reward follow the rule; with
  `nan_aware`, "all equal" is over the group's finite rewards.
"""

import chex
import jax.numpy as jnp

_SCALES = ("group", "none", "batch")


def _check_rewards(rewards_B: chex.Array, group_size: int) -> None:
    chex.assert_rank(rewards_B, 1)
    if not jnp.issubdtype(rewards_B.dtype, jnp.floating):
        raise TypeError(f"rewards_B must be a floating array, got dtype {rewards_B.dtype}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards_B.shape[0] % group_size:
        raise ValueError(
            f"rewards_B has {rewards_B.shape[0]} samples, not a multiple of group_size={group_size}"
        )


def _all_equal(x_PG: chex.Array, valid_PG: chex.Array) -> chex.Array:
    """[P, 1] bool: the row has a valid entry and all its valid entries are equal (False with a NaN among
    them, so NaN still propagates when rewards are not `nan_aware`)."""
    hi = jnp.max(jnp.where(valid_PG, x_PG, -jnp.inf), axis=1, keepdims=True)
    lo = jnp.min(jnp.where(valid_PG, x_PG, jnp.inf), axis=1, keepdims=True)
    return hi == lo


def _masked_mean_std(x_PG: chex.Array, valid_PG: chex.Array, axis) -> tuple[chex.Array, chex.Array]:
    """Mean and unbiased std over `axis` of the entries where `valid_PG` (std 0 if fewer than 2 valid)."""
    n = jnp.sum(valid_PG, axis=axis, keepdims=True).astype(x_PG.dtype)
    x0_PG = jnp.where(valid_PG, x_PG, 0.0)
    mean = jnp.sum(x0_PG, axis=axis, keepdims=True) / jnp.maximum(n, 1.0)
    sq = jnp.where(valid_PG, jnp.square(x_PG - mean), 0.0)
    var = jnp.sum(sq, axis=axis, keepdims=True) / jnp.maximum(n - 1.0, 1.0)
    return mean, jnp.sqrt(var)


def group_advantages(
    rewards_B: chex.Array,
    group_size: int,
    *,
    scale: str = "group",
    eps: float = 1e-6,
    nan_aware: bool = False,
) -> chex.Array:
    """Group-relative advantages of GRPO and its variants.

    GRPO     ("group"): A_i = (R_i - mu_g) / (sigma_g + eps)
    Dr.GRPO  ("none"):  A_i = R_i - mu_g
    TRL      ("batch"): A_i = (R_i - mu_g) / (sigma_batch(R) + eps)
    with mu_g the group mean and sigma the unbiased std. GRPO: Shao et al., arXiv:2402.03300; Dr.GRPO:
    Liu et al., arXiv:2503.20783. eps: verl 1e-6 (default here), TRL 1e-4.

    Args:
      rewards_B: [B] float rewards, N = P * group_size, groups contiguous. NaN marks a failed reward only when
        `nan_aware` is set (otherwise NaN propagates to its whole group).
      group_size: G, samples per prompt.
      scale: "group", "none" or "batch".
      eps: added to the std before dividing.
      nan_aware: leave NaN rewards out of means and stds and give them advantage 0 (TRL semantics).

    Returns:
      [B] advantages, dtype of `rewards_B`.
    """
    _check_rewards(rewards_B, group_size)
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {_SCALES}, got {scale!r}")
    valid_B = ~jnp.isnan(rewards_B) if nan_aware else jnp.ones(rewards_B.shape, bool)
    r_PG = rewards_B.reshape(-1, group_size)
    valid_PG = valid_B.reshape(-1, group_size)
    if group_size == 1:  # verl special case: no baseline, unit scale.
        mean_P1, std_P1 = jnp.zeros_like(r_PG), jnp.ones_like(r_PG)
    else:
        mean_P1, std_P1 = _masked_mean_std(r_PG, valid_PG, axis=1)
    centred_PG = r_PG - mean_P1
    if group_size > 1:  # every reward equal => exactly 0 (module docstring), not an ulp over std + eps
        centred_PG = jnp.where(_all_equal(r_PG, valid_PG), 0.0, centred_PG)
    if scale == "group":
        adv_PG = centred_PG / (std_P1 + eps)
    elif scale == "none":
        adv_PG = centred_PG
    else:
        _, std_batch = _masked_mean_std(rewards_B, valid_B, axis=0)
        adv_PG = centred_PG / (std_batch + eps)
    adv_B = adv_PG.reshape(-1)
    if nan_aware:
        adv_B = jnp.where(valid_B, adv_B, 0.0)
    return adv_B


def rloo_advantages(rewards_B: chex.Array, group_size: int) -> chex.Array:
    """REINFORCE leave-one-out advantages.

    A_i = R_i - (1/(G-1)) sum_{j in g(i), j != i} R_j = G/(G-1) (R_i - mu_g);  A_i = 0 exactly when the
    group's rewards are all equal.
    Kool et al., "Buy 4 REINFORCE samples, get a baseline for free!" (2019);
    Ahmadian et al., arXiv:2402.14740.

    Args:
      rewards_B: [B] float rewards, groups of `group_size` contiguous.
      group_size: G >= 2.

    Returns:
      [B] advantages.
    """
    _check_rewards(rewards_B, group_size)
    if group_size < 2:
        raise ValueError(f"rloo_advantages needs group_size >= 2 (leave-one-out baseline), got {group_size}")
    r_PG = rewards_B.reshape(-1, group_size)
    loo_mean_PG = (jnp.sum(r_PG, axis=1, keepdims=True) - r_PG) / (group_size - 1)
    adv_PG = jnp.where(_all_equal(r_PG, jnp.ones(r_PG.shape, bool)), 0.0, r_PG - loo_mean_PG)
    return adv_PG.reshape(-1)


def dynamic_sampling_mask(rewards_B: chex.Array, group_size: int) -> chex.Array:
    """DAPO dynamic-sampling filter: keep the groups whose rewards are not all equal.

    keep_i = max_{j in g(i)} R_j > min_{j in g(i)} R_j.  DAPO, Yu et al., arXiv:2503.14476 (section 3.2).
    NaN rewards are ignored; an all-NaN group is dropped.

    Args:
      rewards_B: [B] float rewards, groups of `group_size` contiguous.
      group_size: G.

    Returns:
      [B] bool, True for every sample of a group with non-zero reward spread.
    """
    _check_rewards(rewards_B, group_size)
    r_PG = rewards_B.reshape(-1, group_size)
    keep_P1 = jnp.nanmax(r_PG, axis=1, keepdims=True) > jnp.nanmin(r_PG, axis=1, keepdims=True)
    return jnp.broadcast_to(keep_P1, r_PG.shape).reshape(-1)
