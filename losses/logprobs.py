"""Per-token log-probabilities and entropy from final hidden states, in vocabulary chunks.

For hidden state h_t (the LM-head input), unembedding W [D, V] and temperature tau:
  z_t      = h_t W / tau                                  (float32)
  logp_t   = z_t[y_t] - logsumexp(z_t)
  H_t      = -sum_v p_tv log p_tv = logsumexp(z_t) - sum_v p_tv z_tv
The V axis is processed in chunks of C columns with an online (streaming) logsumexp, so no [B, T, V] array is
ever materialised: with running max m, s = sum_v exp(z_v - m) and u = sum_v exp(z_v - m)(z_v - m), a new chunk
with max m' updates
  s <- e^{m - m'} s + sum_c e^{z_c - m'}
  u <- e^{m - m'} (u + s (m - m')) + sum_c e^{z_c - m'} (z_c - m')
and finally logsumexp = m + log s, H = log s - u / s.
Online softmax normaliser: Milakov & Gimelshein, arXiv:1805.02867.

Gradients: plain autodiff through `lax.scan` whose body is wrapped in `jax.checkpoint`, so the backward pass
saves only the [B, T] carries per chunk and recomputes each chunk's logits; peak memory stays O(B T C + D V).
Targets outside [0, V) (e.g. a padding id of -1) give a finite, meaningless log-prob: mask them.
"""

import chex
import jax
import jax.numpy as jnp

_NEG_INIT = -1e30  # finite start for the running max, so that 0 * (m - m') stays 0 (not 0 * inf = NaN).


def token_logprobs_and_entropy(
    hidden_BTD: chex.Array,
    w_DV: chex.Array,
    targets_BT: chex.Array,
    *,
    chunk_size: int = 8192,
    temperature: float = 1.0,
) -> tuple[chex.Array, chex.Array]:
    """log pi(y_t | ...) and the policy entropy per token, computed chunk by chunk over V (module docstring).

    Args:
      hidden_BTD: [B, T, D] final (normed) hidden states, any float dtype (upcast to float32 in the matmul).
      w_DV: [D, V] unembedding matrix (tied models: embedding.T).
      targets_BT: [B, T] int token ids y_t.
      chunk_size: C, vocabulary columns per step (V need not be a multiple of C).
      temperature: tau > 0 applied to the logits (as the sampler does).

    Returns:
      (logp_BT, entropy_BT), both float32 [B, T].
    """
    chex.assert_rank([hidden_BTD, w_DV, targets_BT], [3, 2, 2])
    chex.assert_equal_shape_prefix([hidden_BTD, targets_BT], 2)
    chex.assert_type(targets_BT, int)
    if hidden_BTD.shape[-1] != w_DV.shape[0]:
        raise ValueError(f"hidden_BTD has D={hidden_BTD.shape[-1]} but w_DV has D={w_DV.shape[0]}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    v = w_DV.shape[1]
    c = min(chunk_size, v)
    n = -(-v // c)
    offsets_n = jnp.arange(n, dtype=jnp.int32) * c
    shape_BT = targets_BT.shape

    @jax.checkpoint
    def step(carry, offset):
        m_BT, s_BT, u_BT, tgt_BT = carry
        # The last chunk is shifted left to end at V (no padded copy of W); columns already seen are masked.
        start = jnp.minimum(offset, v - c)
        w_DC = jax.lax.dynamic_slice_in_dim(w_DV, start, c, axis=1)
        z_BTC = jnp.einsum("BTD,DC->BTC", hidden_BTD, w_DC, preferred_element_type=jnp.float32) / temperature
        col_C = start + jnp.arange(c, dtype=jnp.int32)
        valid_C = col_C >= offset
        new_m_BT = jnp.maximum(m_BT, jnp.max(jnp.where(valid_C, z_BTC, -jnp.inf), axis=-1))
        shifted_BTC = jnp.where(valid_C, z_BTC - new_m_BT[..., None], 0.0)
        e_BTC = jnp.where(valid_C, jnp.exp(shifted_BTC), 0.0)
        alpha_BT = jnp.exp(m_BT - new_m_BT)
        u_BT = alpha_BT * (u_BT + s_BT * (m_BT - new_m_BT)) + jnp.sum(e_BTC * shifted_BTC, axis=-1)
        s_BT = alpha_BT * s_BT + jnp.sum(e_BTC, axis=-1)
        hit_BTC = (col_C == targets_BT[..., None]) & valid_C
        tgt_BT = tgt_BT + jnp.sum(jnp.where(hit_BTC, z_BTC, 0.0), axis=-1)
        return (new_m_BT, s_BT, u_BT, tgt_BT), None

    zeros_BT = jnp.zeros(shape_BT, jnp.float32)
    init = (jnp.full(shape_BT, _NEG_INIT, jnp.float32), zeros_BT, zeros_BT, zeros_BT)
    (m_BT, s_BT, u_BT, tgt_BT), _ = jax.lax.scan(step, init, offsets_n)
    log_s_BT = jnp.log(s_BT)
    return tgt_BT - (m_BT + log_s_BT), log_s_BT - u_BT / s_BT
