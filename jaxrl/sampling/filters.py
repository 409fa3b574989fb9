"""Per-step token choice: temperature, top-k / top-p (nucleus) filtering, per-row random draws.

The order of operations follows Hugging Face `generate` (temperature, then top-k, then top-p), so that the
same settings mean the same distribution on both sides:

    p(v) ∝ exp(z_v / τ) · 1[v ∈ top-k(z)] · 1[v ∈ nucleus_p(softmax(z/τ) restricted to top-k)]

where the nucleus is the smallest prefix of the tokens sorted by probability whose mass reaches `top_p`
(Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration", arXiv:1904.09751). The token that
crosses `top_p` is kept, so at least one token always survives.

Deviations / choices:
* Ties at the top-k threshold: tokens whose logit equals the k-th largest are all kept (as in HF), so more
  than k tokens can survive exactly tied float logits.
* Randomness is drawn per row from `fold_in(fold_in(key, step), row)`, so a row's tokens depend only on
  (seed, step, global row index) and not on how the batch is split across devices.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


def apply_top_k(logits_BV: jax.Array, top_k: int) -> jax.Array:
    """Sets every logit outside the row's `top_k` largest to -inf.

    Args:
      logits_BV: [B, V] float logits.
      top_k: static int, 1 <= top_k; values >= V leave the logits unchanged.

    Returns:
      [B, V] logits, -inf outside the top k.
    """
    chex.assert_rank(logits_BV, 2)
    vocab = logits_BV.shape[-1]
    if top_k >= vocab:
        return logits_BV
    kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    return jnp.where(logits_BV < kth_B1, _NEG_INF, logits_BV)


def apply_top_p(logits_BV: jax.Array, top_p: float | jax.Array) -> jax.Array:
    """Nucleus filter: keeps the smallest set of most likely tokens whose probability mass reaches `top_p`.

        keep(v) = [Σ_{u ranked before v} softmax(z)_u < top_p]

    Args:
      logits_BV: [B, V] float logits (already temperature-scaled and top-k filtered, -inf allowed).
      top_p: scalar in (0, 1]; may be traced.

    Returns:
      [B, V] logits, -inf outside the nucleus.
    """
    chex.assert_rank(logits_BV, 2)
    order_BV = jnp.argsort(-logits_BV, axis=-1, stable=True)
    sorted_BV = jnp.take_along_axis(logits_BV, order_BV, axis=-1)
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
    keep_sorted_BV = mass_before_BV < top_p
    keep_sorted_BV = keep_sorted_BV.at[:, 0].set(True)
    # Scatter the keep mask back to vocabulary order.
    rows_B1 = jnp.arange(logits_BV.shape[0])[:, None]
    keep_BV = jnp.zeros_like(keep_sorted_BV).at[rows_B1, order_BV].set(keep_sorted_BV)
    return jnp.where(keep_BV, logits_BV, _NEG_INF)


def filtered_logits(
    logits_BV: jax.Array, temperature: jax.Array, *, top_k: int | None, top_p: jax.Array | None
) -> jax.Array:
    """Temperature-scaled, top-k then top-p filtered logits: the log-weights tokens are sampled from.

    Args:
      logits_BV: [B, V] raw model logits.
      temperature: scalar > 0 (may be traced).
      top_k: static int or None (no top-k).
      top_p: scalar or None (no top-p); may be traced.

    Returns:
      [B, V] float32 logits with -inf for excluded tokens.
    """
    chex.assert_rank(logits_BV, 2)
    z_BV = logits_BV.astype(jnp.float32) / temperature
    if top_k is not None:
        z_BV = apply_top_k(z_BV, top_k)
    if top_p is not None:
        z_BV = apply_top_p(z_BV, top_p)
    return z_BV


def row_keys(key: jax.Array, step: jax.Array, rows_B: jax.Array) -> jax.Array:
    """One PRNG key per row: fold_in(fold_in(key, step), row). rows_B are global row indices [B] int32; step is
    a scalar (all rows at one step) or [B] (each row at its own step: `jaxrl.sampling.continuous`)."""
    if jnp.ndim(step) == 0:
        step_key = jax.random.fold_in(key, step)
        return jax.vmap(lambda r: jax.random.fold_in(step_key, r))(rows_B)
    return jax.vmap(lambda t, r: jax.random.fold_in(jax.random.fold_in(key, t), r))(step, rows_B)


def choose_tokens(
    logits_BV: jax.Array,
    keys_B: jax.Array | None,
    temperature: jax.Array,
    *,
    greedy: bool,
    top_k: int | None,
    top_p: jax.Array | None,
) -> jax.Array:
    """Next token per row: argmax when `greedy`, else a draw from `filtered_logits` (Gumbel-max per row).

    Args:
      logits_BV: [B, V] raw model logits.
      keys_B: [B] PRNG keys (unused when greedy).
      temperature: scalar > 0 (ignored when greedy).
      greedy: static; temperature 0 means greedy.
      top_k, top_p: see `filtered_logits`.

    Returns:
      [B] int32 token ids.
    """
    chex.assert_rank(logits_BV, 2)
    if greedy:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    z_BV = filtered_logits(logits_BV, temperature, top_k=top_k, top_p=top_p)
    draw = jax.vmap(lambda k, z: jax.random.categorical(k, z))
    return draw(keys_B, z_BV).astype(jnp.int32)


def sampled_logprobs(logits_BV: jax.Array, tok_B: jax.Array, temperature: jax.Array, *,
                     greedy: bool) -> jax.Array:
    """The "old log-prob" of each chosen token: ℓ_b = log softmax(z_b / τ)[y_b], the *tempered* policy over the
    whole vocabulary (τ = 1 when greedy).

    This is what TRL (`_get_per_token_logps`: logits / temperature) and verl (`logits.div_(temperature)`) use on
    both sides of the ratio, and what the trainer recomputes (`LossSpec.temperature` = `rollout.temperature`,
    `jaxrl.rl.setup.loss_spec`), so π_θ/π_old is exactly 1 before the first update at any τ. Top-k / top-p are
    NOT applied: the truncated, renormalised distribution the token was drawn from (vLLM's log-probs) has no
    gradient through its support and makes the trainer's untruncated recomputation disagree, which biases the
    ratio; no peer trains on it. At τ = 1 without filtering ℓ is exactly the sampling distribution's.

    Args:
      logits_BV: [B, V] raw logits. tok_B: [B] chosen tokens. temperature: scalar τ > 0 (ignored if greedy).
    Returns:
      [B] float32 log-probabilities.
    """
    chex.assert_rank([logits_BV, tok_B], [2, 1])
    z_BV = logits_BV if greedy else logits_BV / temperature
    return jnp.take_along_axis(jax.nn.log_softmax(z_BV, axis=-1), tok_B[:, None], axis=-1)[:, 0]


def emit_tokens(logits_BV: jax.Array, key: jax.Array | None, t: jax.Array, rows_B: jax.Array, live_B: jax.Array,
                tokens_BT: jax.Array, logp_BT: jax.Array, length_B: jax.Array, *, temperature, greedy: bool,
                top_k: int | None, top_p, pad_id: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One decode step's tokens, written at column `t` of the rows' buffers: every decode loop of the sampler
    (`engine`, `multiturn`) emits its tokens here.

    Each row's token is drawn from its own key (`row_keys(key, t, rows_B)`: global row ids, so a row's tokens
    do not depend on the batch it sits in) or taken greedily; its log-prob is `sampled_logprobs`'. Rows that
    are no longer live get `pad_id` and log-prob 0, and only the live rows' lengths grow.

    Returns:
      (tok_B, tokens_BT, logp_BT, length_B): the step's tokens (pad on rows not live) and the updated buffers.
    """
    chex.assert_rank([logits_BV, tokens_BT, logp_BT], 2)
    keys_B = None if greedy else row_keys(key, t, rows_B)
    tok_B = choose_tokens(logits_BV, keys_B, temperature, greedy=greedy, top_k=top_k, top_p=top_p)
    logp_B = sampled_logprobs(logits_BV, tok_B, temperature, greedy=greedy)
    tok_B = jnp.where(live_B, tok_B, pad_id)
    tokens_BT = jax.lax.dynamic_update_slice(tokens_BT, tok_B[:, None], (0, t))
    logp_BT = jax.lax.dynamic_update_slice(logp_BT, jnp.where(live_B, logp_B, 0.0)[:, None], (0, t))
    return tok_B, tokens_BT, logp_BT, length_B + live_B.astype(jnp.int32)
