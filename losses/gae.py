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


def outcome_token_rewards(rewards_N: chex.Array, mask_NT: chex.Array) -> chex.Array:
    """Places each row's scalar reward at its last trained token (verl's token_level_rewards), 0 elsewhere.

    Args:
      rewards_N: [N] float outcome rewards.
      mask_NT: [N, T] response mask (1 = trained token); may have holes.

    Returns:
      [N, T] float32; a row without trained tokens is all 0.
    """
    chex.assert_rank([rewards_N, mask_NT], [1, 2])
    chex.assert_equal_shape_prefix([rewards_N, mask_NT], 1)
    m_NT = mask_NT.astype(bool)
    t = m_NT.shape[1]
    last_N = t - 1 - jnp.argmax(m_NT[:, ::-1], axis=1)  # index of the last True (argmax: first maximum)
    at_last_NT = (jnp.arange(t)[None, :] == last_N[:, None]) & jnp.any(m_NT, axis=1, keepdims=True)
    return jnp.where(at_last_NT, rewards_N.astype(jnp.float32)[:, None], 0.0)


def gae_advantages(
    token_rewards_NT: chex.Array,
    values_NT: chex.Array,
    mask_NT: chex.Array,
    *,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[chex.Array, chex.Array]:
    """GAE advantages and value targets (module docstring), verl's masking of holes, optional whitening.

    Args:
      token_rewards_NT: [N, T] float per-token rewards (`outcome_token_rewards` for an outcome reward).
      values_NT: [N, T] float critic values of the rollout (V_old).
      mask_NT: [N, T] response mask (1 = trained token, 0 = padding or tool observation).
      gamma: discount γ in [0, 1].
      lam: GAE λ in [0, 1].
      whiten: whiten the advantages over the batch's trained tokens (verl always does).

    Returns:
      (adv_NT, returns_NT): [N, T] float32 each, 0 at masked positions, gradient stopped. returns = A + V
      before whitening.
    """
    chex.assert_rank([token_rewards_NT, values_NT, mask_NT], 2)
    chex.assert_equal_shape([token_rewards_NT, values_NT, mask_NT])
    _check_unit("gamma", gamma)
    _check_unit("lam", lam)
    m_NT = mask_NT.astype(bool)
    r_NT = jnp.where(m_NT, token_rewards_NT.astype(jnp.float32), 0.0)
    v_NT = jnp.where(m_NT, values_NT.astype(jnp.float32), 0.0)
    g, gl = jnp.float32(gamma), jnp.float32(gamma * lam)

    def step(carry, x):
        next_v_N, next_a_N = carry
        r_N, v_N, m_N = x
        a_N = jnp.where(m_N, r_N + g * next_v_N - v_N + gl * next_a_N, next_a_N)
        return (jnp.where(m_N, v_N, next_v_N), a_N), a_N

    zeros_N = jnp.zeros(m_NT.shape[0], jnp.float32)
    _, adv_TN = jax.lax.scan(step, (zeros_N, zeros_N), (r_NT.T, v_NT.T, m_NT.T), reverse=True)
    adv_NT = jnp.where(m_NT, adv_TN.T, 0.0)
    returns_NT = jnp.where(m_NT, adv_NT + v_NT, 0.0)
    if whiten:
        adv_NT = jnp.where(m_NT, masked_whiten(adv_NT, m_NT), 0.0)
    return jax.lax.stop_gradient(adv_NT), jax.lax.stop_gradient(returns_NT)


def value_loss(
    values_NT: chex.Array,
    old_values_NT: chex.Array,
    returns_NT: chex.Array,
    mask_NT: chex.Array,
    *,
    clip: float | None,
    agg: "AggMode | str" = AggMode.TOKEN_MEAN,
    horizon: int | float | None = None,
    normalizer: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """PPO clipped value loss (module docstring), verl `compute_value_loss`.

    Args:
      values_NT: [N, T] float critic predictions V (the only input that receives a gradient).
      old_values_NT: [N, T] float rollout values V_old (centre of the clip range).
      returns_NT: [N, T] float value targets R (from `gae_advantages`).
      mask_NT: [N, T] response mask.
      clip: c ≥ 0 (verl `critic.cliprange_value`); None: no clipping, l_t = (V − R)².
      agg: aggregation mode (verl `loss_agg_mode`).
      horizon: seq-mean-token-sum-norm constant, passed to `aggregate`.
      normalizer: full mini-batch normaliser from `aggregation_normalizer` (gradient accumulation).

    Returns:
      (loss, metrics): scalar loss; metrics `critic/vf_clip_frac` and `critic/vpred_mean` (this batch's mask).
    """
    chex.assert_rank([values_NT, old_values_NT, returns_NT, mask_NT], 2)
    chex.assert_equal_shape([values_NT, old_values_NT, returns_NT, mask_NT])
    if clip is not None and not clip >= 0.0:
        raise ValueError(f"value_loss: clip must be >= 0 or None, got {clip}")
    m_NT = mask_NT.astype(bool)
    v_NT = jnp.where(m_NT, values_NT.astype(jnp.float32), 0.0)
    old_NT = jax.lax.stop_gradient(jnp.where(m_NT, old_values_NT.astype(jnp.float32), 0.0))
    ret_NT = jax.lax.stop_gradient(jnp.where(m_NT, returns_NT.astype(jnp.float32), 0.0))
    unclipped_NT = jnp.square(v_NT - ret_NT)
    if clip is None:
        loss_NT, clipped_frac = unclipped_NT, jnp.float32(0.0)
    else:
        v_clip_NT = jnp.clip(v_NT, old_NT - clip, old_NT + clip)
        clipped_NT = jnp.square(v_clip_NT - ret_NT)
        loss_NT = jnp.maximum(unclipped_NT, clipped_NT)
        clipped_frac = masked_mean((clipped_NT > unclipped_NT).astype(jnp.float32), m_NT)
    loss = 0.5 * aggregate(loss_NT, m_NT, agg, horizon=horizon, normalizer=normalizer)
    metrics = {
        "critic/vf_clip_frac": clipped_frac,
        "critic/vpred_mean": masked_mean(jax.lax.stop_gradient(v_NT), m_NT),
    }
    return loss, metrics
