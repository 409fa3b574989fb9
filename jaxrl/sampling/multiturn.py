"""Batched turn-by-turn decoding for multi-turn episodes (agents with tools), on a jitted KV-cache sampler.

One `TurnDecoder.turn(contexts, max_new)` call decodes the next action of every live episode together:

    cache, z_B = forward(chunk_BW, cache)              # new context tokens of each row (left-padded to W)
    for t < gen_width while some row is live:          # lax.while_loop
        y_B ~ filter(z_B / τ);  ℓ_B = log_softmax(z_B / τ)[y_B]
        live_B &= not (y_B ∈ eos  or  the last tokens spell a stop sequence  or  t + 1 = max_new_B)
        z_B, cache = forward(y_B, mask = live_B, cache) # a token that ends the turn is not fed here

Two cache policies (`mode`):
* "reprefill": every turn starts from an empty cache and the chunk is the whole context (prompt, earlier
  actions and observations). Simplest and always correct; costs one prefill of the full context per turn.
* "continue": each row keeps its cache across turns, so the chunk is only what the cache lacks: the token
  that ended the previous turn plus the new observation. Rows share one write index (`KVCache.index`), so
  every turn uses W + (steps decoded) slots of the `cache_slots` capacity; padding and unused decode slots
  stay invalid (masked), which gives the same attention as a contiguous cache. When the next turn would not
  fit, the live rows are re-prefilled into a fresh cache ("compaction"), so the result never depends on the
  capacity, only the speed does.

Shapes are bucketed (chunk width W by `chunk_buckets`, decode buffer by `gen_buckets`); the row count N is
fixed for the episode batch (finished rows get max_new = 0 and a masked dummy token), and temperature,
top-p and per-row max_new are traced. So a rollout compiles once per (chunk bucket, fresh cache or not),
never per turn; `compile_count()` counts traces.

Hosts (multi-controller JAX): with `row_sharding` (the batch layout of the B rows,
`jaxrl.sharding.row_sharding`) each host passes the contexts of the rows it owns only (None elsewhere,
`jaxrl.sharding.hosts.row_owners`): the chunk is built from every host's rows as one global array, the
outputs are pinned to the same layout and each host reads back its own rows' tokens; only the chunk width,
the per-row lengths and stop flags are exchanged. When some row sits on several hosts' devices (too few rows
to split, or a batch axis that does not span the hosts) the chunk is gathered from the owners first, so
that every holder feeds the same values. Without `row_sharding` every host passes every row's context and
reads every row back (the turn's rows gathered).

Stop sequences are token-id sequences (`stop_token_sequences` turns strings into the ids the tokenizer
produces for them); a turn is ended when its last sampled tokens equal one of them. The stop tokens are
kept in the action (they were sampled). Row r of turn k draws with fold_in(fold_in(fold_in(key(seed), k),
t), rows[r]), so an episode's tokens do not depend on which other episodes share its batch. Log-probs are
those of `jaxrl.sampling.engine`: log softmax(z/τ) at the chosen token, no top-k / top-p.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl.models import KVCache
from jaxrl.sampling import filters
from jaxrl.sampling.batching import DEFAULT_GEN_BUCKETS, DEFAULT_PROMPT_BUCKETS, bucket, left_pad
from jaxrl.sampling.engine import CPU_DECODE_OPTIONS, CPU_PER_LAYER_OPTIONS, _last_logits, is_eos, pin_cache
from jaxrl.sharding import hosts

MODES = ("reprefill", "continue")
_trace_count = 0


def compile_count() -> int:
    """Number of times the turn function has been traced (≈ compiled) in this process."""
    return _trace_count


class Turn(NamedTuple):
    """One decoded turn for B rows (host arrays; rows with max_new = 0 have length 0).

    Attributes:
      tokens: [B, T] int32 sampled tokens, pad after the end.
      logprobs: [B, T] float32 log π(token | context), 0 after the end.
      lengths: [B] int32 sampled tokens of the turn (stop tokens and EOS included).
      stopped: [B] bool, the turn ended with an EOS token or a stop sequence (False: it hit max_new).
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    stopped: np.ndarray


def stop_token_sequences(tokenizer, stops: Sequence[str]) -> list[list[int]]:
    """Token-id sequences that end a turn: each stop string as encoded alone and after a space/newline.

    BPE tokenizers may merge a stop string with the character before it ("…x </search>" -> " </", …); the
    variants cover the common cases. A stop string tokenized some other way does not end the turn (the action
    then runs to max_new or EOS; its tokens stay exact either way).
    """
    out: list[list[int]] = []
    for s in stops:
        base = tokenizer.encode(s, add_special_tokens=False)
        variants = [base]
        for lead in (" ", "\n"):
            lead_ids = tokenizer.encode(lead, add_special_tokens=False)
            ids = tokenizer.encode(lead + s, add_special_tokens=False)
            if ids[: len(lead_ids)] != lead_ids:  # the lead merged into the stop string's first token
                variants.append(ids)
        for v in variants:
            if v and v not in out:
                out.append(list(v))
    return out


def stop_table(stop_sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """[S, K] int32 stop sequences for the decode loops' match: right-aligned, left-filled with -1 (any token);
    one row of -3 (matches nothing: the token history starts at -2, tokens are >= 0) when there are none."""
    stops = [list(map(int, s)) for s in stop_sequences if len(s)]
    k = max([len(s) for s in stops] or [1])
    table_SK = np.full((max(len(stops), 1), k), -1 if stops else -3, np.int32)
    for i, s in enumerate(stops):
        table_SK[i, k - len(s):] = s
    return table_SK


def _turn(graphdef, state, cache, chunk_BW, chunk_mask_BW, key, rows_B, temperature, top_p, max_new_B,
          stop_SK, eos_E, pad_id, *, gen_width, greedy, top_k, use_top_p, per_layer, capacity, keep_cache):
    """Prefills the chunk into `cache` (a fresh one of `capacity` slots when None), then decodes one turn.

    Args:
      graphdef, state: `nnx.split` of a `jaxrl.models.Transformer`.
      cache: the carried `KVCache` (continue mode) or None (fresh cache).
      chunk_BW, chunk_mask_BW: [N, W] left-padded new tokens and their mask (idle rows: all masked).
      key: PRNG key of this turn; rows_B: [B] int32 global row ids for the per-row draws.
      temperature, top_p: float32 scalars; max_new_B: [B] int32 per-row turn budget <= gen_width.
      stop_SK: [S, K] int32 stop sequences, right-aligned and left-filled with -1 (= any token); a row of -3
        matches nothing (no stop sequences). eos_E: [E] int32 (-1 never matches); pad_id: int32 scalar.

    Returns:
      (tokens_BT, logp_BT, length_B, stopped_B, cache or None) with T = gen_width.
    """
    global _trace_count
    _trace_count += 1
    chex.assert_rank([chunk_BW, chunk_mask_BW, stop_SK], 2)
    model = nnx.merge(graphdef, state)
    pin = model.constrain  # the batch layout of the rows (a no-op without a mesh)
    chunk_BW, chunk_mask_BW = pin(chunk_BW, ("batch", "length")), pin(chunk_mask_BW, ("batch", "length"))
    rows = chunk_BW.shape[0]
    if cache is None:
        cache = KVCache.init(model.cfg, rows, capacity, model.cfg.dtype)
        cache = pin_cache(jax.lax.optimization_barrier(cache), pin)
    layers = None
    if per_layer:
        layers, cache = model.layer_states(), cache.unstack()
    out = model.forward(chunk_BW, None, chunk_mask_BW, cache=cache, layers=layers, return_hidden=True,
                        return_logits=False)
    logits_BV = _last_logits(model, out.hidden[:, -1])
    top_p_arg = top_p if use_top_p else None
    width = stop_SK.shape[1]

    def cond(carry):
        return (carry[0] < gen_width) & ~jnp.all(carry[5])

    def body(carry):
        t, logits_BV, cache, tokens_BT, logp_BT, done_B, length_B, hist_BK, stopped_B = carry
        live_B = ~done_B
        tok_B, tokens_BT, logp_BT, length_B = filters.emit_tokens(
            logits_BV, key, t, rows_B, live_B, tokens_BT, logp_BT, length_B, temperature=temperature,
            greedy=greedy, top_k=top_k, top_p=top_p_arg, pad_id=pad_id)
        hist_BK = jnp.concatenate([hist_BK[:, 1:], tok_B[:, None]], axis=1)
        stop_hit_B = jnp.any(jnp.all((stop_SK[None] == -1) | (hist_BK[:, None, :] == stop_SK[None]), -1), -1)
        hit_B = live_B & (is_eos(tok_B, eos_E) | stop_hit_B)
        done_B = done_B | hit_B | (live_B & (length_B >= max_new_B))
        feed_B = live_B & ~done_B  # a token that ends the turn is fed at the start of the next one
        step = model.forward(tok_B[:, None], None, feed_B[:, None], cache=cache, layers=layers)
        logits_BV = step.logits[:, -1].astype(jnp.float32)
        return t + 1, logits_BV, step.cache, tokens_BT, logp_BT, done_B, length_B, hist_BK, stopped_B | hit_B

    init = (jnp.int32(0), logits_BV, out.cache, jnp.full((rows, gen_width), pad_id, jnp.int32),
            jnp.zeros((rows, gen_width), jnp.float32), max_new_B <= 0, jnp.zeros((rows,), jnp.int32),
            jnp.full((rows, width), -2, jnp.int32), jnp.zeros((rows,), bool))
    _, _, cache, tokens_BT, logp_BT, _, length_B, _, stopped_B = jax.lax.while_loop(cond, body, init)
    tokens_BT, logp_BT = pin(tokens_BT, ("batch", "length")), pin(logp_BT, ("batch", "length"))
    length_B, stopped_B = pin(length_B, ("batch",)), pin(stopped_B, ("batch",))
    return tokens_BT, logp_BT, length_B, stopped_B, (cache if keep_cache else None)


_STATIC = ("graphdef", "gen_width", "greedy", "top_k", "use_top_p", "per_layer", "capacity", "keep_cache")
_turn_jit = jax.jit(_turn, static_argnames=_STATIC, donate_argnames=("cache",))
_turn_cpu = jax.jit(_turn, static_argnames=_STATIC, donate_argnames=("cache",), compiler_options=CPU_DECODE_OPTIONS)
_turn_cpu_per_layer = jax.jit(_turn, static_argnames=_STATIC, donate_argnames=("cache",),
                              compiler_options=CPU_PER_LAYER_OPTIONS)


class TurnDecoder:
    """Decodes the next turn of N episodes at once, keeping (mode "continue") or rebuilding their KV caches.

    Args:
      graphdef, state: `nnx.split(model)` of a `jaxrl.models.Transformer`.
      num_rows: N, fixed for the decoder's life (finished episodes stay as idle rows).
      max_new_tokens: the largest per-turn budget (sets the decode buffer width by `gen_buckets`).
      temperature, top_k, top_p: as `jaxrl.sampling.generate` (τ = 0: greedy).
      eos_ids: tokens that end a turn (and usually the episode); stop_sequences: token-id lists that end it.
      pad_id: pad token; seed: int or PRNG key; rows: [B] global row ids of the random draws (default
        0..N-1; give each host its own range so that hosts draw independently).
      mode: "reprefill" or "continue"; cache_slots: the carried cache capacity in continue mode.
      chunk_buckets, gen_buckets: allowed chunk / decode widths (None: exact sizes, more compiles).
      per_layer: decode on per-layer buffers (default: on CPU), see `jaxrl.sampling.engine`.
      row_sharding: the rows' layout (`jaxrl.sharding.row_sharding`; the model must pin the same one, i.e.
        be built with `make_constrain` of that mesh): each host then gives and gets back only the rows it
        holds (module notes). None: every host gives every row.
    """

    def __init__(self, graphdef, state, num_rows: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, eos_ids: Sequence[int] = (),
                 stop_sequences: Sequence[Sequence[int]] = (), pad_id: int = 0, seed: int | jax.Array = 0,
                 rows: Sequence[int] | None = None, mode: str = "reprefill", cache_slots: int = 1024,
                 chunk_buckets: Sequence[int] | None = DEFAULT_PROMPT_BUCKETS,
                 gen_buckets: Sequence[int] | None = DEFAULT_GEN_BUCKETS, per_layer: bool | None = None,
                 row_sharding=None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: allowed values are {', '.join(map(repr, MODES))}")
        if int(max_new_tokens) < 1 or not float(temperature) >= 0.0:
            raise ValueError(f"need max_new_tokens >= 1 and temperature >= 0, got {max_new_tokens}, "
                             f"{temperature}")
        self.graphdef, self.state, self.num_rows, self.mode = graphdef, state, int(num_rows), mode
        self.gen_width = bucket(int(max_new_tokens), gen_buckets, "completion")
        self.max_new_tokens = int(max_new_tokens)
        self.temperature, self.top_k, self.top_p = float(temperature), top_k, top_p
        self.pad_id, self.chunk_buckets, self.cache_slots = int(pad_id), chunk_buckets, int(cache_slots)
        self.eos_E = np.asarray(tuple(eos_ids) or (-1,), np.int32)
        self.stop_SK = stop_table(stop_sequences)
        self.key = jax.random.key(int(seed)) if isinstance(seed, (int, np.integer)) else seed
        self.rows_B = np.asarray(np.arange(self.num_rows) if rows is None else rows, np.int32)
        if self.rows_B.shape != (self.num_rows,):
            raise ValueError(f"rows must hold {self.num_rows} row ids, got shape {self.rows_B.shape}")
        leaf = jax.tree.leaves(state)[0]
        devices = leaf.devices() if isinstance(leaf, jax.Array) else jax.devices()
        on_cpu = all(d.platform == "cpu" for d in devices)
        self.per_layer = on_cpu if per_layer is None else bool(per_layer)
        self._fn = (_turn_cpu_per_layer if self.per_layer else _turn_cpu) if on_cpu else _turn_jit
        self._cache, self._index = None, 0
        self._fed: list[list[int]] = [[] for _ in range(self.num_rows)]  # tokens in each row's cache
        self.stats = {"prefill_tokens": 0, "compactions": 0}  # prefill: the owned rows' tokens
        self.row_sharding = row_sharding
        self.owned_B, self._owners, self._shared = np.ones((self.num_rows,), bool), None, False
        if row_sharding is not None:
            self._owners = hosts.row_owners(row_sharding, (self.num_rows,))
            self.owned_B = self._owners == jax.process_index()
            self._shared = hosts.shared_rows(row_sharding, (self.num_rows,))

    def prefill_tokens(self) -> int:
        """Context tokens prefilled so far, over all hosts' rows."""
        n = self.stats["prefill_tokens"]
        return n if self.row_sharding is None else int(hosts.sum_across_hosts(np.asarray(n, np.int64)))

    def turn(self, turn_index: int, contexts: Sequence[Sequence[int] | None], max_new: Sequence[int]) -> Turn:
        """Decodes one turn: row i continues `contexts[i]` for at most `max_new[i]` tokens (None/0: idle).

        In continue mode the context of a row must extend what the row was given before (its earlier
        context plus the tokens this decoder sampled); ValueError otherwise. With `row_sharding`, rows this
        host does not own must be None; the result then holds this host's rows' tokens and log-probs (pad
        and 0 elsewhere) and every row's lengths and stop flags.
        """
        if len(contexts) != self.num_rows or len(max_new) != self.num_rows:
            raise ValueError(f"turn needs {self.num_rows} contexts and budgets, got {len(contexts)}, "
                             f"{len(max_new)}")
        live = [c is not None and int(m) > 0 for c, m in zip(contexts, max_new)]
        if any(ok and not own for ok, own in zip(live, self.owned_B)):
            raise ValueError("a context was given for a row this host does not own (row_sharding)")
        budget_B = np.asarray([min(int(m), self.max_new_tokens) if ok else 0 for m, ok in zip(max_new, live)],
                              np.int32)
        fresh = self.mode == "reprefill" or self._cache is None
        chunks = self._chunks(contexts, live, fresh)
        width = self._width(chunks)
        if not fresh and self._index + width + self.gen_width > self.cache_slots:
            self.stats["compactions"] += 1
            fresh, chunks = True, self._chunks(contexts, live, True)
            width = self._width(chunks)
        capacity = 0  # unused with a carried cache (a constant, so it never causes a compile)
        if fresh:
            capacity = (max(self.cache_slots, width + self.gen_width) if self.mode == "continue"
                        else width + self.gen_width)
        chunk_BW, mask_BW = left_pad(chunks, width, self.pad_id)
        mask_BW[~np.asarray(live)] = False  # idle rows: a masked dummy token leaves their cache as it was
        self.stats["prefill_tokens"] += int(sum(len(c) for c, ok, own in zip(chunks, live, self.owned_B)
                                                if ok and own))
        keep = self.mode == "continue"
        if self.row_sharding is not None:  # every host's rows as one global array
            parts = (chunk_BW, mask_BW, budget_B)
            if self._shared:  # a row held by several hosts: all of them feed its owner's values
                parts = tuple(hosts.gather_owned(x, self._owners) for x in parts)
            chunk_BW, mask_BW, budget_B = (hosts.host_to_global(x, self.row_sharding) for x in parts)
        out = self._fn(
            self.graphdef, self.state, None if fresh else self._cache, chunk_BW, mask_BW,
            jax.random.fold_in(self.key, int(turn_index)), self.rows_B, jnp.float32(self.temperature),
            jnp.float32(1.0 if self.top_p is None else self.top_p), budget_B, self.stop_SK, self.eos_E,
            jnp.int32(self.pad_id), gen_width=self.gen_width, greedy=self.temperature == 0.0,
            top_k=None if self.top_k is None else int(self.top_k), use_top_p=self.top_p is not None,
            per_layer=self.per_layer, capacity=capacity, keep_cache=keep,
        )
        if self.row_sharding is None:  # every host drives every episode: the turn's rows are gathered
            tokens, logp, lengths, stopped = (hosts.to_host(x) for x in out[:4])
        else:  # this host's rows only; per-row lengths and stop flags of every row
            tokens, logp = hosts.fetch_held(out[0], self.pad_id), hosts.fetch_held(out[1])
            lengths, stopped = hosts.to_host(out[2]), hosts.to_host(out[3])
        self._cache = out[4]
        self._index = (0 if fresh else self._index) + width + int(lengths.max(initial=0))
        for i, ok in enumerate(live):  # each cache now holds its chunk and all but the last action token
            if keep and ok:
                n = int(lengths[i])
                self._fed[i] = (list(contexts[i]) if fresh else self._fed[i] + chunks[i]) + \
                    [int(x) for x in tokens[i, : max(n - 1, 0)]]
            elif keep and fresh:
                self._fed[i] = []  # an idle row's new cache holds nothing: if it comes back, prefill it all
        return Turn(tokens, logp, lengths, stopped & (lengths > 0))

    def _width(self, chunks) -> int:
        """The chunk width bucket, the same on every host."""
        longest = max(len(c) for c in chunks)
        if self.row_sharding is not None:
            longest = hosts.max_across_hosts(longest)
        return bucket(longest, self.chunk_buckets, "chunk")

    def _chunks(self, contexts, live, fresh: bool) -> list[list[int]]:
        out = []
        for i, (ctx, ok) in enumerate(zip(contexts, live)):
            if not ok:
                out.append([self.pad_id])
                continue
            ctx = [int(x) for x in ctx]
            if fresh:
                out.append(ctx)
                continue
            fed = self._fed[i]
            if ctx[: len(fed)] != fed or len(ctx) <= len(fed):
                raise ValueError(f"row {i}: the context does not extend the tokens already in its KV cache "
                                 f"({len(fed)} cached, {len(ctx)} given); continue mode needs append-only "
                                 "contexts")
            out.append(ctx[len(fed):])
        if not any(live):
            out[0] = [self.pad_id]
        return out
