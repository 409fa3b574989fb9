"""PPO critic side: outcome reward placement, Generalised Advantage Estimation, and the clipped value loss.

GAE: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
arXiv:1506.02438. Reference: verl `verl/trainer/ppo/core_algos.py::compute_gae_advantage_return` and
`compute_value_loss`, with `verl.utils.torch_functional.masked_whiten`.

With r_t the token reward, V_t the critic's value and m_t the response mask of one row, a reverse recursion
over t = T-1 .. 0 that starts from V_next = 0 and A_next = 0 (nothing past the end):

  δ_t = r_t + γ V_next − V_t,    Â_t = δ_t + γλ A_next
  trained token (m_t = 1):   A_t = Â_t,       then  V_next ← V_t,  A_next ← Â_t
  hole (m_t = 0):            A_t = A_next,    V_next and A_next pass through unchanged

so a tool observation inside a multi-turn episode is skipped: the trained token before it bootstraps from the
value of the next trained token after it, with one factor γ (resp. γλ), and its reward is dropped. Then

  R_t = A_t + V_t                                (value target, before whitening)
  A_t ← m_t · whiten_m(A)_t,   whiten_m(x) = (x − μ) / sqrt(σ² + 1e-8), μ, σ² (unbiased) over the batch's mask

γ: discount (verl `algorithm.gamma`), λ: GAE trace decay (verl `algorithm.lam`). γ = λ = 1 gives
A_t = Σ_{t' ≥ t} r_t' − V_t (Monte Carlo); λ = 0 the one-step TD error.

Value loss (PPO clipped value, verl `compute_value_loss`), with V_old the rollout's values and c the clip:

  V_clip = clip(V, V_old − c, V_old + c),   l_t = max((V − R)², (V_clip − R)²),   loss = ½ · aggregate(l, m)
  critic/vf_clip_frac = masked mean of [(V_clip − R)² > (V − R)²]   (strict, verl `torch.gt`)

Choices and deviations from verl:
* Advantages and returns are 0 at masked positions (verl leaves the passed-through advantage, whitened, and
  A + V there); the trained positions are identical.
* Inputs at masked positions are ignored even when NaN/inf (verl multiplies them by 0).
* Fewer than two trained tokens: whitening variance 0, as `masked_whiten` (verl raises).
* `outcome_token_rewards` puts the reward at the last *trained* token; verl's reward managers put it at the
  last non-padding token, the same one unless a row ends on an untrained token (then GAE would drop it).
"""

import chex
import jax
import jax.numpy as jnp

from jaxrl.losses.aggregation import AggMode, aggregate, masked_mean
from jaxrl.losses.gdpo import masked_whiten


def _check_unit(name: str, x: float) -> None:
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"gae_advantages: {name} must be in [0, 1], got {x}")


def outcome_token_rewards(rewards_B: chex.Array, mask_BT: chex.Array) -> chex.Array:
    """Places each row's scalar reward at its last trained token (verl's token_level_rewards), 0 elsewhere.

    Args:
      rewards_B: [B] float outcome rewards.
      mask_BT: [B, T] response mask (1 = trained token); may have holes.

    Returns:
      [B, T] float32; a row without trained tokens is all 0.
    """
    chex.assert_rank([rewards_B, mask_BT], [1, 2])
    chex.assert_equal_shape_prefix([rewards_B, mask_BT], 1)
    m_BT = mask_BT.astype(bool)
    t = m_BT.shape[1]
    last_B = t - 1 - jnp.argmax(m_BT[:, ::-1], axis=1)  # index of the last True (argmax: first maximum)
    at_last_BT = (jnp.arange(t)[None, :] == last_B[:, None]) & jnp.any(m_BT, axis=1, keepdims=True)
    return jnp.where(at_last_BT, rewards_B.astype(jnp.float32)[:, None], 0.0)


def gae_advantages(
    token_rewards_BT: chex.Array,
    values_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[chex.Array, chex.Array]:
    """GAE advantages and value targets (module docstring), verl's masking of holes, optional whitening.

    Args:
      token_rewards_BT: [B, T] float per-token rewards (`outcome_token_rewards` for an outcome reward).
      values_BT: [B, T] float critic values of the rollout (V_old).
      mask_BT: [B, T] response mask (1 = trained token, 0 = padding or tool observation).
      gamma: discount γ in [0, 1].
      lam: GAE λ in [0, 1].
      whiten: whiten the advantages over the batch's trained tokens (verl always does).

    Returns:
      (adv_BT, returns_BT): [B, T] float32 each, 0 at masked positions, gradient stopped. returns = A + V
      before whitening.
    """
    chex.assert_rank([token_rewards_BT, values_BT, mask_BT], 2)
    chex.assert_equal_shape([token_rewards_BT, values_BT, mask_BT])
    _check_unit("gamma", gamma)
    _check_unit("lam", lam)
    m_BT = mask_BT.astype(bool)
    r_BT = jnp.where(m_BT, token_rewards_BT.astype(jnp.float32), 0.0)
    v_BT = jnp.where(m_BT, values_BT.astype(jnp.float32), 0.0)
    g, gl = jnp.float32(gamma), jnp.float32(gamma * lam)

    def step(carry, x):
        next_v_B, next_a_B = carry
        r_B, v_B, m_B = x
        a_B = jnp.where(m_B, r_B + g * next_v_B - v_B + gl * next_a_B, next_a_B)
        return (jnp.where(m_B, v_B, next_v_B), a_B), a_B

    zeros_B = jnp.zeros(m_BT.shape[0], jnp.float32)
    _, adv_TN = jax.lax.scan(step, (zeros_B, zeros_B), (r_BT.T, v_BT.T, m_BT.T), reverse=True)
    adv_BT = jnp.where(m_BT, adv_TN.T, 0.0)
    returns_BT = jnp.where(m_BT, adv_BT + v_BT, 0.0)
    if whiten:
        adv_BT = jnp.where(m_BT, masked_whiten(adv_BT, m_BT), 0.0)
    return jax.lax.stop_gradient(adv_BT), jax.lax.stop_gradient(returns_BT)


def value_loss(
    values_BT: chex.Array,
    old_values_BT: chex.Array,
    returns_BT: chex.Array,
    mask_BT: chex.Array,
    *,
    clip: float | None,
    agg: "AggMode | str" = AggMode.TOKEN_MEAN,
    horizon: int | float | None = None,
    normalizer: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """PPO clipped value loss (module docstring), verl `compute_value_loss`.

    Args:
      values_BT: [B, T] float critic predictions V (the only input that receives a gradient).
      old_values_BT: [B, T] float rollout values V_old (centre of the clip range).
      returns_BT: [B, T] float value targets R (from `gae_advantages`).
      mask_BT: [B, T] response mask.
      clip: c ≥ 0 (verl `critic.cliprange_value`); None: no clipping, l_t = (V − R)².
      agg: aggregation mode (verl `loss_agg_mode`).
      horizon: seq-mean-token-sum-norm constant, passed to `aggregate`.
      normalizer: full mini-batch normaliser from `aggregation_normalizer` (gradient accumulation).

    Returns:
      (loss, metrics): scalar loss; metrics `critic/vf_clip_frac` and `critic/vpred_mean` (this batch's mask).
    """
    chex.assert_rank([values_BT, old_values_BT, returns_BT, mask_BT], 2)
    chex.assert_equal_shape([values_BT, old_values_BT, returns_BT, mask_BT])
    if clip is not None and not clip >= 0.0:
        raise ValueError(f"value_loss: clip must be >= 0 or None, got {clip}")
    m_BT = mask_BT.astype(bool)
    v_BT = jnp.where(m_BT, values_BT.astype(jnp.float32), 0.0)
    old_BT = jax.lax.stop_gradient(jnp.where(m_BT, old_values_BT.astype(jnp.float32), 0.0))
    ret_BT = jax.lax.stop_gradient(jnp.where(m_BT, returns_BT.astype(jnp.float32), 0.0))
    unclipped_BT = jnp.square(v_BT - ret_BT)
    if clip is None:
        loss_BT, clipped_frac = unclipped_BT, jnp.float32(0.0)
    else:
        v_clip_BT = jnp.clip(v_BT, old_BT - clip, old_BT + clip)
        clipped_BT = jnp.square(v_clip_BT - ret_BT)
        loss_BT = jnp.maximum(unclipped_BT, clipped_BT)
        clipped_frac = masked_mean((clipped_BT > unclipped_BT).astype(jnp.float32), m_BT)
    loss = 0.5 * aggregate(loss_BT, m_BT, agg, horizon=horizon, normalizer=normalizer)
    metrics = {
        "critic/vf_clip_frac": clipped_frac,
        "critic/vpred_mean": masked_mean(jax.lax.stop_gradient(v_BT), m_BT),
    }
    return loss, metrics
