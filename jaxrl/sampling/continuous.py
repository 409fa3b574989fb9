"""Continuous batching: S decode slots, each freed slot refilled with the next pending row, in one jitted loop.

    cache_P, z_P = prefill(prompts_PL)                     # the P prompts once (the static engine's prefill)
    while a row is pending or a slot is live:              # lax.while_loop, static shapes throughout
        free slots take the next pending rows r (in row order): copy the KV cache and the last logits of
            prompt r // G into the slot, t_s = 0           # one row copy per admitted slot
        y_s ~ filter(z_s / τ) with key fold_in(fold_in(key, t_s), r_s)   # the row's own stream
        tokens[r_s, t_s] = y_s; a slot whose row emitted EOS or reached its budget is freed
        z_S, cache = forward(y_S, position = len(prompt) + t_S, write slot = L + t_S)  # each slot at its own t

With a static batch (`jaxrl.sampling.engine`) a row that stopped at token 40 keeps its row of every decode
step until the longest row of the batch ends; here it hands its slot to the next row, so a long-tailed batch
costs about Σ lengths / S steps of S rows instead of max length steps of P·G rows (vLLM, SGLang, JetStream
refill slots the same way).

Results do not depend on the slot a row lands in: the row's random stream is keyed by its row id and its own
step (`filters.row_keys`), its KV cache has the static engine's layout (the prompt in slots [0, L), token t
at slot L + t: `KVCache.with_row_index`), and its prefill is the static engine's. So for one seed `continuous`
and `static` give the same tokens and log-probs (tests/sampling/test_continuous.py, tests/train/test_engine_cli.py:
bit for bit on one device and on 8 with a slot or more per device; through the CLI on an FSDP mesh with one
slot per device the log-probs differed in the last bit, a one-row dot rounding unlike a four-row one).

Costs: the slots' cache is S x (L + T) plus the P prompts' prefill cache (kept for the whole call, the static
engine's prefill size); each admission copies one cache row (`_admit`: a loop over the admitted slots only).
A slot that stops runs one more forward (its token's, unused), as a static row does at the end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.models import KVCache
from jaxrl.sampling import filters
from jaxrl.sampling.engine import Programs, finished_rows, is_eos, pin_cache, prefill, start
from jaxrl.sharding import Constrain

_trace_count = 0


def compile_count() -> int:
    """Number of times the continuous rollout has been traced (≈ compiled) in this process."""
    return _trace_count


def admission(row_S: jax.Array, next_row: jax.Array, rows: int) -> tuple[jax.Array, jax.Array]:
    """(admit_S, new row_S): free slots (row −1) take pending rows next_row, next_row + 1, … in slot order."""
    free_S = row_S < 0
    candidate_S = next_row + jnp.cumsum(free_S, dtype=jnp.int32) - 1
    admit_S = free_S & (candidate_S < rows)
    return admit_S, jnp.where(admit_S, candidate_S, row_S)


def _copy_row(dst, src, s, p, axis: int):
    """dst with its row `s` (along `axis`) replaced by row `p` of src."""
    return jax.lax.dynamic_update_index_in_dim(dst, jax.lax.dynamic_index_in_dim(src, p, axis, keepdims=True),
                                               s, axis)


def _admit(cache: KVCache, logits_SV, cache_P: KVCache, logits_PV, admit_S, prompt_S):
    """The admitted slots' cache rows and logits set to their prompts' (one row copy per admitted slot)."""
    order_S = jnp.argsort(~admit_S, stable=True).astype(jnp.int32)  # admitted slots first

    def copy(i, carry):
        cache, logits_SV = carry
        s = order_S[i]
        p = prompt_S[s]
        if cache.per_layer:
            k = tuple(_copy_row(c, src, s, p, 0) for c, src in zip(cache.k, cache_P.k))
            v = tuple(_copy_row(c, src, s, p, 0) for c, src in zip(cache.v, cache_P.v))
        else:
            k, v = _copy_row(cache.k, cache_P.k, s, p, 1), _copy_row(cache.v, cache_P.v, s, p, 1)
        valid = _copy_row(cache.valid_BS, cache_P.valid_BS, s, p, 0)
        return cache.replace(k=k, v=v, valid_BS=valid), _copy_row(logits_SV, logits_PV, s, p, 0)

    return jax.lax.fori_loop(0, jnp.sum(admit_S, dtype=jnp.int32), copy, (cache, logits_SV))


def _continuous(graphdef: nnx.GraphDef, state: nnx.State, tokens_PL, mask_PL, key, temperature, top_p,
                max_new_tokens, eos_E, pad_id, budget_B, *, num_samples: int, gen_width: int, slots: int,
                greedy: bool, top_k: int | None, use_top_p: bool, per_layer: bool = False,
                constrain: Constrain | None = None):
    """Continuous-batching rollout; the arguments and returns of `engine._rollout`, plus `slots` S (static).

    Returns (tokens_BT, logprobs_BT, lengths_B, finished_B, decode steps) with B = P·G, T = gen_width.
    """
    global _trace_count
    _trace_count += 1
    model, pin, tokens_PL, mask_PL = start(graphdef, state, tokens_PL, mask_PL, (temperature, top_p, max_new_tokens,
                                                                                 pad_id), eos_E, budget_B,
                                           num_samples, constrain)
    num_prompts, width = tokens_PL.shape
    rows = num_prompts * num_samples
    cache_P, logits_PV = prefill(model, tokens_PL, mask_PL, gen_width)
    cache = pin_cache(KVCache.init(model.cfg, slots, width + gen_width, model.cfg.dtype), pin)
    cache = cache.with_row_index(jnp.full((slots,), width, jnp.int32))
    layers = None
    if per_layer:
        layers, cache, cache_P = model.layer_states(), cache.unstack(), cache_P.unstack()
    prompt_len_P = jnp.sum(mask_PL, axis=-1, dtype=jnp.int32)
    limit_B = jnp.minimum(budget_B, max_new_tokens)
    top_p_arg = top_p if use_top_p else None

    def cond(carry):
        next_row, row_S = carry[0], carry[1]
        return (next_row < rows) | jnp.any(row_S >= 0)

    def body(carry):
        next_row, row_S, t_S, logits_SV, cache, tokens_BT, logp_BT, length_B = carry
        admit_S, row_S = admission(row_S, next_row, rows)
        next_row = next_row + jnp.sum(admit_S, dtype=jnp.int32)
        safe_row_S = jnp.maximum(row_S, 0)  # idle slots (row -1) index row 0; their writes are dropped below
        prompt_S = safe_row_S // num_samples
        cache, logits_SV = jax.lax.cond(jnp.any(admit_S), _admit, lambda c, z, *_: (c, z),
                                        cache, logits_SV, cache_P, logits_PV, admit_S, prompt_S)
        t_S = jnp.where(admit_S, 0, t_S)
        live_S = row_S >= 0
        keys_S = None if greedy else filters.row_keys(key, t_S, safe_row_S)
        tok_S = filters.choose_tokens(logits_SV, keys_S, temperature, greedy=greedy, top_k=top_k, top_p=top_p_arg)
        logp_S = filters.sampled_logprobs(logits_SV, tok_S, temperature, greedy=greedy)
        out_S = jnp.where(live_S, row_S, rows)  # rows (out of bounds) for idle slots: their writes are dropped
        tokens_BT = tokens_BT.at[out_S, t_S].set(tok_S, mode="drop")
        logp_BT = logp_BT.at[out_S, t_S].set(logp_S, mode="drop")
        length_B = length_B.at[out_S].set(t_S + 1, mode="drop")
        stop_S = is_eos(tok_S, eos_E) | (t_S + 1 >= limit_B[safe_row_S])
        step = model.forward(tok_S[:, None], (prompt_len_P[prompt_S] + t_S)[:, None], jnp.ones((slots, 1), bool),
                             cache=cache.with_row_index(width + jnp.minimum(t_S, gen_width - 1)), layers=layers)
        row_S = jnp.where(live_S & stop_S, -1, row_S)
        return (next_row, row_S, t_S + 1, step.logits[:, -1].astype(jnp.float32), step.cache, tokens_BT,
                logp_BT, length_B)

    init = (jnp.int32(0), jnp.full((slots,), -1, jnp.int32), jnp.zeros((slots,), jnp.int32),
            jnp.zeros((slots, logits_PV.shape[-1]), jnp.float32), cache,
            jnp.full((rows, gen_width), pad_id, jnp.int32), jnp.zeros((rows, gen_width), jnp.float32),
            jnp.zeros((rows,), jnp.int32))
    init = (jnp.int32(0),) + init
    out = jax.lax.while_loop(lambda c: cond(c[1:]), lambda c: (c[0] + 1,) + body(c[1:]), init)
    steps, (tokens_BT, logp_BT, length_B) = out[0], out[6:]
    rows_BT, rows_B = ("batch", None), ("batch",)
    finished_B = finished_rows(tokens_BT, length_B, eos_E)
    return (pin(tokens_BT, rows_BT), pin(logp_BT, rows_BT), pin(length_B, rows_B), pin(finished_B, rows_B),
            steps)


_STATIC = ("graphdef", "num_samples", "gen_width", "slots", "greedy", "top_k", "use_top_p", "per_layer",
           "constrain")
continuous_for = Programs(_continuous, _STATIC)  # continuous_for(on_cpu=, per_layer=): the program to call
continuous = continuous_for.accelerator
