"""Shared-prompt forward: the G completions of a GRPO group read their common prompt's layers once.

In GRPO every prompt is sampled G times, and an unshared update runs the same left-padded prompt through
every layer G times (TRL does too). Here the rows of a group are laid out as one sequence of S = W + G·T
tokens,

    [prompt (W) | completion 1 (T) | … | completion G (T)]        tokens_PS, P = B / G groups,

and everything that acts per token — embedding, norms, q/k/v/o projections, MLP and the residual wiring of
every block variant (pre, post, SiameseNorm) — runs on that layout unchanged: `Transformer.forward_groups`
feeds it through the same layer loop (scanned or unrolled, any remat, merged or unmerged LoRA). Only
attention knows the structure (`GroupVisibility`, dispatched in `layers.Attention`):

    prompt queries:         softmax over the W prompt keys, causal           (the unshared prompt rows)
    completion g's queries: one softmax over [W prompt keys | T keys of completion g], causal in the latter

Both are `attention.attend`, the recomputing core, so no [.., T, W + T] probabilities are kept for the
backward pass; the prompt's keys and values are repeated G times for the completions' softmax and autodiff
sums their gradients over the G copies. Positions are the unshared forward's: prompt token i at
cumsum(mask)_i − 1, completion token t at n_prompt + cumsum(completion mask)_t − 1 (both clipped at 0).
The hidden state that predicts completion token 0 is the prompt's last position (prompts are left-padded),
repeated G times; tokens 1 … T−1 are predicted by completion positions 0 … T−2 (`prediction_hidden`).

Equal to the unshared forward at every real position (same keys, visibility and positions; only summation
orders differ: tests/models/test_shared_prompt.py). Deviation: a padding prompt query, which sees no key,
averages the W prompt values (unshared: all W + T values); no real position and no loss term reads it. So an
empty prompt (no real token) predicts completion token 0 from different garbage in the two paths.

Work per layer: projections and MLP over P·W + B·T tokens instead of B·(W + T); attention scores
P·W²/2 + B·T·(W + T/2) instead of B·(W²/2 + T·(W + T/2)). At W = T, G = 8 that is 0.56x the tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl.models.attention import KeyMask, attend


class GroupVisibility(NamedTuple):
    """Which keys each query of the grouped layout sees (the `visible` argument of `Attention`), as causal
    `KeyMask`s (no [.., L, S] tensor; their `kernel` picks the attention kernel).

    prompt: over [P, W] keys: prompt query i sees prompt key j (real and j <= i).
    completion: over [B, W + T] keys: completion query t of row b (at key slot W + t) sees [its group's
      prompt keys (real) | its own completion keys u (real and u <= t)].
    """

    prompt: KeyMask
    completion: KeyMask


def layout(prompt_PW, prompt_mask_PW, completion_BT, completion_mask_BT, *, kernel: str = "xla"):
    """(tokens_PS, positions_PS, GroupVisibility) of P prompts and their B = P·G completions (rows of a group
    consecutive), S = W + G·T.

    Args:
      prompt_PW: [P, W] int, left-padded prompts; prompt_mask_PW: [P, W] bool, real prompt tokens.
      completion_BT: [B, T] int; completion_mask_BT: [B, T] bool, real completion tokens (the forward's mask,
        not the loss mask).
      kernel: the attention kernel (`TransformerConfig.attention`).
    """
    chex.assert_rank([prompt_PW, prompt_mask_PW, completion_BT, completion_mask_BT], 2)
    chex.assert_equal_shape([prompt_PW, prompt_mask_PW])
    chex.assert_equal_shape([completion_BT, completion_mask_BT])
    (p, w), (b, t) = prompt_PW.shape, completion_BT.shape
    if w < 1 or b % p:
        raise ValueError(f"{b} completion rows do not form groups over {p} prompts of width {w} >= 1")
    g = b // p
    pmask_PW, cmask_BT = prompt_mask_PW.astype(bool), completion_mask_BT.astype(bool)
    count_B1 = jnp.repeat(jnp.sum(pmask_PW, axis=-1, dtype=jnp.int32), g)[:, None]
    prompt_pos_PW = jnp.maximum(jnp.cumsum(pmask_PW, axis=-1, dtype=jnp.int32) - 1, 0)
    comp_pos_BT = jnp.maximum(count_B1 + jnp.cumsum(cmask_BT, axis=-1, dtype=jnp.int32) - 1, 0)
    tokens_PS = jnp.concatenate([prompt_PW, completion_BT.reshape(p, g * t).astype(prompt_PW.dtype)], axis=1)
    positions_PS = jnp.concatenate([prompt_pos_PW, comp_pos_BT.reshape(p, g * t)], axis=1)
    keys_BS = jnp.concatenate([jnp.repeat(pmask_PW, g, axis=0), cmask_BT], axis=-1)
    visible = GroupVisibility(KeyMask(pmask_PW, kernel=kernel), KeyMask(keys_BS, kernel=kernel))
    return tokens_PS, positions_PS, visible


def attend_groups(q_PSKGH, k_PKSH, v_PKSH, visible: GroupVisibility) -> jax.Array:
    """Attention of the grouped layout (module docstring): [P, S, K, G', H] output (G' queries per kv head).

    Args:
      q_PSKGH: [P, S, K, G', H] queries; k_PKSH, v_PKSH: [P, K, S, H] keys (after RoPE) and values.
      visible: the layout's `GroupVisibility`.
    """
    p, s, kv, gq, h = q_PSKGH.shape
    w = visible.prompt.key_mask_BS.shape[-1]
    b, t = visible.completion.key_mask_BS.shape[0], visible.completion.key_mask_BS.shape[1] - w
    g = b // p
    chex.assert_shape([k_PKSH, v_PKSH], (p, kv, s, h))
    chex.assert_equal(s, w + g * t)
    out_PWKGH = attend(q_PSKGH[:, :w], k_PKSH[:, :, :w], v_PKSH[:, :, :w], visible.prompt, causal=True)

    def completion_keys(x_PKSH):  # [B, K, W + T, H]: the group's prompt keys, then the row's own
        own_BKTH = x_PKSH[:, :, w:].reshape(p, kv, g, t, h).transpose(0, 2, 1, 3, 4).reshape(b, kv, t, h)
        return jnp.concatenate([jnp.repeat(x_PKSH[:, :, :w], g, axis=0), own_BKTH], axis=2)

    q_BTKGH = q_PSKGH[:, w:].reshape(b, t, kv, gq, h)
    out_BTKGH = attend(q_BTKGH, completion_keys(k_PKSH), completion_keys(v_PKSH), visible.completion,
                       causal=True)
    return jnp.concatenate([out_PWKGH, out_BTKGH.reshape(p, g * t, kv, gq, h)], axis=1)


def prediction_hidden(hidden_PSD: jax.Array, width: int, group: int) -> jax.Array:
    """[B, T, D] hidden states predicting each completion token: the prompt's last position (repeated over the
    group) for token 0, completion positions 0 … T−2 for tokens 1 … T−1."""
    p, s, d = hidden_PSD.shape
    t = (s - width) // group
    last_B1D = jnp.repeat(hidden_PSD[:, width - 1], group, axis=0)[:, None]
    comp_BTD = hidden_PSD[:, width:].reshape(p * group, t, d)
    return jnp.concatenate([last_B1D, comp_BTD[:, :t - 1]], axis=1)
