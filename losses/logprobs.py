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

Gradients are analytic (`jax.custom_vjp`). With p = softmax(z), lse = logsumexp(z) and E_p[z] = lse - H:
  d logp_t / d z_tv = 1[v = y_t] - p_tv
  d H_t    / d z_tv = -p_tv (z_tv - E_p[z_t])
so for upstream cotangents g_logp, g_H [B, T]
  dz_tv = g_logp_t (1[v = y_t] - p_tv) - g_H_t p_tv (z_tv - (lse_t - H_t)),   p_tv = exp(z_tv - lse_t)
  d h = (dz / tau) W^T,   d W = h^T (dz / tau)   (summed over B, T).
The forward saves only (h, W, y, lse, H); the backward scans the same chunks, recomputes each chunk's logits
with one matmul and forms dz in one elementwise pass, so peak memory stays O(B T C + D V).
Targets outside [0, V) (e.g. a padding id of -1) give a finite, meaningless log-prob: mask them.
"""

import functools

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
    return _chunked_logprobs_and_entropy(hidden_BTD, w_DV, targets_BT, min(chunk_size, w_DV.shape[1]),
                                         float(temperature))


def _chunk(w_DV: chex.Array, offset: chex.Array, c: int):
    """(start, w_DC, col_C, valid_C) of the chunk at `offset`: the last chunk is shifted left to end at V
    (no padded copy of W) and its columns already seen by the previous chunk are marked invalid."""
    start = jnp.minimum(offset, w_DV.shape[1] - c)
    col_C = start + jnp.arange(c, dtype=jnp.int32)
    return start, jax.lax.dynamic_slice_in_dim(w_DV, start, c, axis=1), col_C, col_C >= offset


def _chunk_logits(hidden_BTD: chex.Array, w_DC: chex.Array, temperature: float) -> chex.Array:
    """z_BTC = h W_C / tau in float32."""
    return jnp.einsum("BTD,DC->BTC", hidden_BTD, w_DC, preferred_element_type=jnp.float32) / temperature


def _offsets(v: int, c: int) -> chex.Array:
    return jnp.arange(-(-v // c), dtype=jnp.int32) * c


def _forward(hidden_BTD, w_DV, targets_BT, c: int, temperature: float):
    """(logp_BT, entropy_BT, lse_BT) by the online logsumexp of the module docstring."""
    shape_BT = targets_BT.shape

    def step(carry, offset):
        m_BT, s_BT, u_BT, tgt_BT = carry
        _, w_DC, col_C, valid_C = _chunk(w_DV, offset, c)
        z_BTC = _chunk_logits(hidden_BTD, w_DC, temperature)
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
    (m_BT, s_BT, u_BT, tgt_BT), _ = jax.lax.scan(step, init, _offsets(w_DV.shape[1], c))
    log_s_BT = jnp.log(s_BT)
    lse_BT = m_BT + log_s_BT
    return tgt_BT - lse_BT, log_s_BT - u_BT / s_BT, lse_BT


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunked_logprobs_and_entropy(hidden_BTD, w_DV, targets_BT, c: int, temperature: float):
    logp_BT, ent_BT, _ = _forward(hidden_BTD, w_DV, targets_BT, c, temperature)
    return logp_BT, ent_BT


def _chunked_fwd(hidden_BTD, w_DV, targets_BT, c: int, temperature: float):
    logp_BT, ent_BT, lse_BT = _forward(hidden_BTD, w_DV, targets_BT, c, temperature)
    return (logp_BT, ent_BT), (hidden_BTD, w_DV, targets_BT, lse_BT, ent_BT)


def _chunked_bwd(c: int, temperature: float, res, g):
    """d h = (dz / tau) W^T and d W = h^T (dz / tau), with dz from the module docstring, chunk by chunk."""
    hidden_BTD, w_DV, targets_BT, lse_BT, ent_BT = res
    g_logp_BT, g_ent_BT = (x.astype(jnp.float32) for x in g)
    mean_z_BT1 = (lse_BT - ent_BT)[..., None]
    lse_BT1, g_logp_BT1, g_ent_BT1 = lse_BT[..., None], g_logp_BT[..., None], g_ent_BT[..., None]
    inv_tau = 1.0 / temperature

    def step(carry, offset):
        dh_BTD, dw_DV = carry
        start, w_DC, col_C, valid_C = _chunk(w_DV, offset, c)
        z_BTC = _chunk_logits(hidden_BTD, w_DC, temperature)
        p_BTC = jnp.exp(z_BTC - lse_BT1)
        hit_BTC = col_C == targets_BT[..., None]
        dz_BTC = jnp.where(
            valid_C,
            (jnp.where(hit_BTC, g_logp_BT1, 0.0) - p_BTC * (g_logp_BT1 + g_ent_BT1 * (z_BTC - mean_z_BT1)))
            * inv_tau,
            0.0,
        )
        dh_BTD = dh_BTD + jnp.einsum("BTC,DC->BTD", dz_BTC, w_DC, preferred_element_type=jnp.float32)
        dw_DC = jnp.einsum("BTD,BTC->DC", hidden_BTD, dz_BTC, preferred_element_type=jnp.float32)
        # Add (not overwrite): the shifted last chunk overlaps columns already written; its dz there is 0.
        dw_DV = jax.lax.dynamic_update_slice_in_dim(
            dw_DV, jax.lax.dynamic_slice_in_dim(dw_DV, start, c, axis=1) + dw_DC, start, axis=1
        )
        return (dh_BTD, dw_DV), None

    init = (jnp.zeros(hidden_BTD.shape, jnp.float32), jnp.zeros(w_DV.shape, jnp.float32))
    (dh_BTD, dw_DV), _ = jax.lax.scan(step, init, _offsets(w_DV.shape[1], c))
    return dh_BTD.astype(hidden_BTD.dtype), dw_DV.astype(w_DV.dtype), None


_chunked_logprobs_and_entropy.defvjp(_chunked_fwd, _chunked_bwd)
