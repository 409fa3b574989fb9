"""Continuous batching of multi-turn episodes: S slots, each holding one episode and its KV cache across turns.

    state = init(S slots x C cache slots)                  # C = max context tokens + one prefill piece
    while an episode is pending or a slot is held:         # the host loop, `jaxrl.envs.slot_episodes`
        feed(the slots to (re)start)                       # a freed slot: the next episode's prompt (fresh cache);
            for each piece of P chunk columns:             # a waiting slot: its last action token + observation
                cache, h = forward(piece, write slot = i_s)     # each slot at its own write index i_s
                i_s += real tokens of the piece                 # right-padded chunks: no gaps in the cache
            z_s = h(last real chunk token) @ unembedding
        advance():                                         # lax.while_loop, static shapes throughout
            y_s ~ filter(z_s / τ), key fold_in(fold_in(fold_in(key, k_s), t_s), r_s)    # episode r, turn k, step t
            the turn of s ends on EOS, a stop sequence or its budget: s stops decoding and waits
            z_S, cache = forward(y_S, mask = still decoding, write slot = i_S);  i_S += still decoding
          until no slot decodes, or `min_waiting` slots ended their turn in this call (device values: all
          hosts agree)
        host: step each waiting slot's environment; a finished episode frees its slot, the next pending
        episode (in episode order) takes it; the others are fed their observation

A slot waiting for its environment keeps its cache (mode "continue" of `jaxrl.sampling.multiturn`: the chunk
of the next turn is only what the cache lacks, the token that ended the turn plus the observation); only a
finished episode frees its slot. Unlike `TurnDecoder`, slots do not share a write index: each episode's
tokens sit contiguously in its own row (`KVCache.with_row_index`), so the cache never needs compaction and
holds at most C = max context + P slots (the last piece of a chunk writes P slots, padding included, whose
invalid tail the next write overwrites).

Results do not depend on the slot an episode lands in nor on the other episodes: episode r's turn k draws
with the key `TurnDecoder` uses for row r of turn k, its positions are its own token count, and its cache
holds its own tokens only. So the engine gives the tokens of `TurnDecoder` (mode "continue") for the same
seed (tests/sampling/test_episode_slots.py). Log-probs agree to 1e-6, not bit for bit: `TurnDecoder` keeps an
episode's keys after left padding at a shared index, this engine from slot 0 on, and XLA:CPU's attention sums
group terms by slot, so some decode steps round differently in the last bit (on the tests' episodes about 5%
of the action log-probs, by <= 4.8e-7; the first token of every turn, from the prefill, is equal). Slots split
over devices (the model pins them as batch rows) give the one-device values bit for bit.

Hosts (multi-controller JAX): the slots are batch rows, laid out as the model pins them (`model.constrain`:
the slots' layout is read off the state `init` returns), and each slot has one owner
(`jaxrl.sharding.hosts.row_owners`). With `by_host`, each host feeds only the slots it owns: the inputs of
`feed` are built from its own slots (length 0 elsewhere) and assembled as global arrays (gathered from their
owners first when a slot sits on several hosts' devices, as `TurnDecoder` does), and `advance` reads back the
turn's tokens of the slots it holds and every slot's lengths and flags. Both are collectives: every host
calls them the same number of times (a host with nothing to feed feeds nothing), and `advance`'s exit is a
device value, so all hosts decode the same steps. Episode r's tokens do not depend on the slot nor the host,
so 2 hosts x 2 devices give the episodes of 1 host x 4 (tests/sharding/test_multihost_cli.py).

Costs: the cache is S x (max context + P); each feed runs every slot's row through ceil(longest chunk / P)
forwards of P columns (slots not fed are masked, as `TurnDecoder` masks its idle rows); each `advance` step
runs all S slots (waiting and free ones masked). Compiles: `init`, `feed` (one chunk width: the context
limit rounded up to whole pieces, the pieces looped to the longest chunk) and `advance` once each;
temperature, top-p, budgets and `min_waiting` are traced; `compile_count()` counts traces.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl.models import KVCache
from jaxrl.sampling import filters
from jaxrl.sampling.batching import DEFAULT_GEN_BUCKETS, bucket
from jaxrl.sampling.engine import Programs, _last_logits, is_eos, pin_cache
from jaxrl.sampling.multiturn import stop_table
from jaxrl.sharding import hosts

_trace_count = 0


def compile_count() -> int:
    """Number of times the slot programs (init, feed, advance) have been traced (≈ compiled) in this process."""
    return _trace_count


class SlotState(NamedTuple):
    """The device state of S slots (a pytree carried between calls).

    Attributes:
      cache: KVCache of S rows x C slots with a per-row write index (the row's token count).
      logits_SV: [S, V] float32 logits of each slot's next token.
      row_S, turn_S: [S] int32 the episode's row id and turn k (the random draws' keys).
      t_S: [S] int32 tokens sampled in the current turn; budget_S: [S] int32 its budget.
      decoding_S: [S] bool, mid-turn; stopped_S: [S] bool, the turn ended on EOS or a stop sequence.
      hist_SK: [S, K] int32 the last K tokens of the turn (stop sequences).
      tokens_ST, logp_ST: [S, T] the turn's tokens (pad after) and log-probs (0 after).
    """

    cache: KVCache
    logits_SV: jax.Array
    row_S: jax.Array
    turn_S: jax.Array
    t_S: jax.Array
    budget_S: jax.Array
    decoding_S: jax.Array
    stopped_S: jax.Array
    hist_SK: jax.Array
    tokens_ST: jax.Array
    logp_ST: jax.Array


def _init(graphdef, state, pad_id, *, slots: int, capacity: int, gen_width: int, stop_width: int,
          per_layer: bool) -> SlotState:
    """S empty slots: a zero cache of `capacity` slots per row (index 0, nothing valid), no slot decoding."""
    global _trace_count
    _trace_count += 1
    model = nnx.merge(graphdef, state)
    pin = model.constrain
    cache = pin_cache(KVCache.init(model.cfg, slots, capacity, model.cfg.dtype), pin)
    cache = cache.with_row_index(jnp.zeros((slots,), jnp.int32))
    if per_layer:
        cache = cache.unstack()
    zeros_S = jnp.zeros((slots,), jnp.int32)
    return SlotState(cache, jnp.zeros((slots, model.cfg.vocab_size), jnp.float32), zeros_S - 1, zeros_S,
                     zeros_S, zeros_S, zeros_S > 0, zeros_S > 0, jnp.full((slots, stop_width), -2, jnp.int32),
                     pin(jnp.full((slots, gen_width), pad_id, jnp.int32), ("batch", None)),
                     pin(jnp.zeros((slots, gen_width), jnp.float32), ("batch", None)))


def _feed(graphdef, state, slots: SlotState, chunk_SW, len_S, fresh_S, row_S, turn_S, budget_S, pad_id, *,
          piece: int, per_layer: bool) -> SlotState:
    """Writes each fed slot's chunk at its own write index and starts its turn; other slots are unchanged.

    Args:
      chunk_SW: [S, W] int32 right-padded new tokens, W a multiple of `piece`; len_S: [S] int32 real tokens
        (0: the slot is not fed). fresh_S: [S] bool, the slot starts a new episode (its cache is emptied first).
      row_S, turn_S, budget_S: [S] int32 the fed slots' episode row ids, turn indices and turn budgets.
    """
    global _trace_count
    _trace_count += 1
    chex.assert_rank(chunk_SW, 2)
    chex.assert_shape([len_S, fresh_S, row_S, turn_S, budget_S], (chunk_SW.shape[0],))
    model = nnx.merge(graphdef, state)
    pin = model.constrain
    chunk_SW = pin(chunk_SW, ("batch", "length"))
    feed_S = len_S > 0
    cache = slots.cache
    cache = cache.replace(valid_BS=cache.valid_BS & ~fresh_S[:, None], index=jnp.where(fresh_S, 0, cache.index))
    layers = model.layer_states() if per_layer else None
    cols_P = jnp.arange(piece, dtype=jnp.int32)

    def body(j, carry):
        cache, hidden_SD = carry
        start = j * piece
        tok_SP = jax.lax.dynamic_slice_in_dim(chunk_SW, start, piece, axis=1)
        mask_SP = (start + cols_P)[None, :] < len_S[:, None]
        out = model.forward(tok_SP, None, mask_SP, cache=cache, layers=layers, return_hidden=True,
                            return_logits=False)
        last_S = len_S - 1 - start  # the column of the chunk's last real token within this piece
        here_S = (last_S >= 0) & (last_S < piece)
        h_SD = jnp.take_along_axis(out.hidden, jnp.clip(last_S, 0, piece - 1)[:, None, None], axis=1)[:, 0]
        hidden_SD = jnp.where(here_S[:, None], h_SD.astype(hidden_SD.dtype), hidden_SD)
        cache = out.cache.with_row_index(cache.index + jnp.sum(mask_SP, axis=1, dtype=jnp.int32))
        return cache, hidden_SD

    pieces = (jnp.max(len_S) + piece - 1) // piece
    hidden_SD = jnp.zeros((chunk_SW.shape[0], model.cfg.hidden_size), model.cfg.dtype)
    cache, hidden_SD = jax.lax.fori_loop(0, pieces, body, (cache, hidden_SD))
    logits_SV = jnp.where(feed_S[:, None], _last_logits(model, hidden_SD), slots.logits_SV)
    on = lambda new, old: jnp.where(feed_S.reshape(feed_S.shape + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
    return SlotState(cache, logits_SV, on(row_S, slots.row_S), on(turn_S, slots.turn_S), on(0, slots.t_S),
                     on(budget_S, slots.budget_S), slots.decoding_S | feed_S, on(False, slots.stopped_S),
                     on(-2, slots.hist_SK), on(pad_id, slots.tokens_ST), on(0.0, slots.logp_ST))


def _advance(graphdef, state, slots: SlotState, key, temperature, top_p, stop_SK, eos_E, pad_id, min_waiting, *,
             greedy: bool, top_k: int | None, use_top_p: bool, per_layer: bool) -> tuple[SlotState, jax.Array]:
    """Decodes every decoding slot until none decodes or `min_waiting` of them ended their turn in this call.

    Args:
      key: the rollout's PRNG key; temperature, top_p: float32 scalars (top_p ignored unless `use_top_p`).
      stop_SK: [S', K] int32 stop sequences, right-aligned, left-filled with -1 (any token); -3 rows match
        nothing. eos_E: [E] int32 (-1 never matches). pad_id, min_waiting: int32 scalars.

    Returns:
      (state, decode steps of this call).
    """
    global _trace_count
    _trace_count += 1
    chex.assert_rank([stop_SK, eos_E, min_waiting], [2, 1, 0])
    model = nnx.merge(graphdef, state)
    layers = model.layer_states() if per_layer else None
    top_p_arg = top_p if use_top_p else None
    entry_S = slots.decoding_S
    num = entry_S.shape[0]

    def cond(carry):
        _, s = carry
        ended = jnp.sum(entry_S & ~s.decoding_S, dtype=jnp.int32)
        return jnp.any(s.decoding_S) & (ended < min_waiting)

    def body(carry):
        steps, s = carry
        live_S = s.decoding_S
        keys_S = None
        if not greedy:
            keys_S = jax.vmap(lambda k, t, r: jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, k), t),
                                                                 r))(s.turn_S, s.t_S, jnp.maximum(s.row_S, 0))
        tok_S = filters.choose_tokens(s.logits_SV, keys_S, temperature, greedy=greedy, top_k=top_k,
                                      top_p=top_p_arg)
        logp_S = filters.sampled_logprobs(s.logits_SV, tok_S, temperature, greedy=greedy)
        tok_S = jnp.where(live_S, tok_S, pad_id)
        out_S = jnp.where(live_S, jnp.arange(num), num)  # out of bounds for idle slots: their writes drop
        tokens_ST = s.tokens_ST.at[out_S, s.t_S].set(tok_S, mode="drop")
        logp_ST = s.logp_ST.at[out_S, s.t_S].set(logp_S, mode="drop")
        t_S = s.t_S + live_S.astype(jnp.int32)
        hist_SK = jnp.where(live_S[:, None], jnp.concatenate([s.hist_SK[:, 1:], tok_S[:, None]], axis=1),
                            s.hist_SK)
        stop_hit_S = jnp.any(jnp.all((stop_SK[None] == -1) | (hist_SK[:, None, :] == stop_SK[None]), -1), -1)
        hit_S = live_S & (is_eos(tok_S, eos_E) | stop_hit_S)
        feed_S = live_S & ~hit_S & (t_S < s.budget_S)  # a token that ends the turn is fed with the next chunk
        step = model.forward(tok_S[:, None], None, feed_S[:, None], cache=s.cache, layers=layers)
        cache = step.cache.with_row_index(s.cache.index + feed_S.astype(jnp.int32))
        return steps + 1, s._replace(cache=cache, logits_SV=step.logits[:, -1].astype(jnp.float32), t_S=t_S,
                                     decoding_S=feed_S, stopped_S=s.stopped_S | hit_S, hist_SK=hist_SK,
                                     tokens_ST=tokens_ST, logp_ST=logp_ST)

    steps, slots = jax.lax.while_loop(cond, body, (jnp.int32(0), slots))
    pin = lambda x: model.constrain(x, ("batch", None))  # noqa: E731 -- the hosts read their own slots' rows
    return slots._replace(tokens_ST=pin(slots.tokens_ST), logp_ST=pin(slots.logp_ST)), steps


_init_for = Programs(_init, ("graphdef", "slots", "capacity", "gen_width", "stop_width", "per_layer"))
_feed_for = Programs(_feed, ("graphdef", "piece", "per_layer"), donate_argnames=("slots",))
_advance_for = Programs(_advance, ("graphdef", "greedy", "top_k", "use_top_p", "per_layer"),
                       donate_argnames=("slots",))


class SlotTurns(NamedTuple):
    """What one `advance` returns (host arrays over the S slots).

    Attributes:
      ended: [S] bool, the slot's turn ended in this call (it now waits to be fed or freed); with `by_host`,
        this host's slots only.
      tokens, logprobs: [S, T] the current turn's tokens and log-probs (valid up to `lengths`; with `by_host`
        at the slots this host holds, pad and 0 elsewhere).
      lengths: [S] int32 tokens of the current turn; stopped: [S] bool, ended on EOS or a stop sequence.
      steps: decode steps of the call.
    """

    ended: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    stopped: np.ndarray
    steps: int


class SlotDecoder:
    """S decode slots for multi-turn episodes (module docstring): `feed` starts slots' turns, `advance` decodes.

    Args:
      graphdef, state: `nnx.split(model)` of a `jaxrl.models.Transformer`.
      num_slots: S >= 1.
      max_context: the most tokens an episode's context may hold (prompt, actions, observations).
      max_new_tokens, temperature, top_k, top_p, eos_ids, stop_sequences, pad_id, seed: as
        `jaxrl.sampling.multiturn.TurnDecoder` (the same draws for the same seed and row ids).
      min_waiting: `advance` returns to the host once this many slots ended their turn in the call (or when
        none decodes). None: max(1, S // 4), a trade between slots idling until the host feeds them (about
        min_waiting / 2 turns' worth of steps each) and host round trips (one feed program per return).
      piece: P, chunk columns per prefill forward; the cache holds max_context + P slots per row.
      gen_buckets: allowed decode buffer widths; per_layer: as `TurnDecoder` (default: on CPU).
      by_host: each host feeds and reads back only the slots it owns (`owned_S`; module notes). False: every
        host feeds every slot the same values and reads every slot back.
    """

    def __init__(self, graphdef, state, num_slots: int, *, max_context: int, max_new_tokens: int,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_ids: Sequence[int] = (), stop_sequences: Sequence[Sequence[int]] = (), pad_id: int = 0,
                 seed: int | jax.Array = 0, min_waiting: int | None = None, piece: int = 32,
                 gen_buckets: Sequence[int] | None = DEFAULT_GEN_BUCKETS, per_layer: bool | None = None,
                 by_host: bool = False):
        if int(num_slots) < 1 or int(max_context) < 1 or int(piece) < 1 or int(max_new_tokens) < 1:
            raise ValueError(f"need num_slots, max_context, piece and max_new_tokens >= 1, got {num_slots}, "
                             f"{max_context}, {piece}, {max_new_tokens}")
        if not float(temperature) >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.graphdef, self.params, self.num_slots = graphdef, state, int(num_slots)
        self.max_context, self.piece, self.max_new_tokens = int(max_context), int(piece), int(max_new_tokens)
        self.width = -(-self.max_context // self.piece) * self.piece  # every chunk fits: one feed program
        self.gen_width = bucket(self.max_new_tokens, gen_buckets, "completion")
        self.temperature, self.top_k, self.top_p, self.pad_id = float(temperature), top_k, top_p, int(pad_id)
        self.min_waiting = max(1, self.num_slots // 4) if min_waiting is None else int(min_waiting)
        self.eos_E = np.asarray(tuple(eos_ids) or (-1,), np.int32)
        self.stop_SK = stop_table(stop_sequences)
        self.key = jax.random.key(int(seed)) if isinstance(seed, (int, np.integer)) else seed
        leaf = jax.tree.leaves(state)[0]
        devices = leaf.devices() if isinstance(leaf, jax.Array) else jax.devices()
        on_cpu = all(d.platform == "cpu" for d in devices)
        self.per_layer = on_cpu if per_layer is None else bool(per_layer)
        programs = dict(on_cpu=on_cpu, per_layer=self.per_layer)
        self._feed, self._advance = _feed_for(**programs), _advance_for(**programs)
        self._state = _init_for(**programs)(graphdef, state, jnp.int32(self.pad_id), slots=self.num_slots,
                                            capacity=self.max_context + self.piece, gen_width=self.gen_width,
                                            stop_width=self.stop_SK.shape[1], per_layer=self.per_layer)
        self._fed: list[list[int]] = [[] for _ in range(self.num_slots)]  # the tokens in each slot's cache
        self._decoding = np.zeros((self.num_slots,), bool)
        self.by_host = bool(by_host)
        self._layout_ST = self._state.tokens_ST.sharding  # the slots' layout, as the model pins them
        spec = getattr(self._layout_ST, "spec", None)
        self._layout_S = self._layout_ST if spec is None else NamedSharding(self._layout_ST.mesh, P(*spec[:1]))
        self._owners_S = hosts.row_owners(self._layout_S, (self.num_slots,))
        self.owned_S = self._owners_S == jax.process_index() if self.by_host else np.ones((self.num_slots,), bool)
        self._shared = self.by_host and hosts.shared_rows(self._layout_S, (self.num_slots,))
        self.stats = {"prefill_tokens": 0, "decode_steps": 0, "slot_steps": 0, "advances": 0}

    def prefill_tokens(self) -> int:
        """Context tokens fed so far, over all hosts' slots."""
        n = self.stats["prefill_tokens"]
        return int(hosts.sum_across_hosts(np.asarray(n, np.int64))) if self.by_host else n

    @property
    def decoding(self) -> np.ndarray:
        """[S] bool, the slots mid-turn (fed and not yet ended)."""
        return self._decoding.copy()

    def feed(self, slots: Sequence[int], contexts: Sequence[Sequence[int]], rows: Sequence[int],
             turns: Sequence[int], budgets: Sequence[int], fresh: Sequence[bool]) -> None:
        """Starts a turn in each of `slots`: slot s continues `contexts[i]` (its whole context) for at most
        `budgets[i]` tokens, drawing as row `rows[i]` at turn `turns[i]`; `fresh[i]`: a new episode (the slot's
        cache is emptied). A continued context must extend the slot's earlier context plus the tokens it
        sampled (ValueError otherwise); a slot still decoding cannot be fed. With `by_host`, only slots this host
        owns (possibly none: every host calls `feed` together)."""
        chunk_SW = np.full((self.num_slots, self.width), self.pad_id, np.int32)
        len_S, fresh_S = np.zeros((self.num_slots,), np.int32), np.zeros((self.num_slots,), bool)
        row_S, turn_S, budget_S = (np.zeros((self.num_slots,), np.int32) for _ in range(3))
        for s, ctx, r, k, b, new in zip(slots, contexts, rows, turns, budgets, fresh, strict=True):
            ctx = [int(x) for x in ctx]
            fed = [] if new else self._fed[s]
            if not self.owned_S[s]:
                raise ValueError(f"slot {s} belongs to process {self._owners_S[s]}; feed only this host's slots")
            if self._decoding[s] or len_S[s]:
                raise ValueError(f"slot {s} is still decoding (or fed twice); feed it after its turn ended")
            if not 1 <= int(b) <= self.max_new_tokens or len(ctx) > self.max_context:
                raise ValueError(f"slot {s}: budget {b} must be in [1, {self.max_new_tokens}] and the context "
                                 f"({len(ctx)} tokens) at most {self.max_context}")
            if ctx[: len(fed)] != fed or len(ctx) <= len(fed):
                raise ValueError(f"slot {s}: the context does not extend the tokens already in its KV cache "
                                 f"({len(fed)} cached, {len(ctx)} given)")
            chunk = ctx[len(fed):]
            chunk_SW[s, : len(chunk)], len_S[s], fresh_S[s] = chunk, len(chunk), bool(new)
            row_S[s], turn_S[s], budget_S[s] = int(r), int(k), int(b)
            self._fed[s], self._decoding[s] = ctx, True
            self.stats["prefill_tokens"] += len(chunk)
        if self.by_host:  # every host's slots as global arrays (a slot on several hosts: its owner's values)
            parts = (chunk_SW, len_S, fresh_S, row_S, turn_S, budget_S)
            if self._shared:
                parts = tuple(hosts.gather_owned(x, self._owners_S) for x in parts)
            chunk_SW = hosts.host_to_global(parts[0], self._layout_ST)
            len_S, fresh_S, row_S, turn_S, budget_S = (hosts.host_to_global(x, self._layout_S) for x in parts[1:])
        self._state = self._feed(self.graphdef, self.params, self._state, chunk_SW, len_S, fresh_S, row_S, turn_S,
                                 budget_S, jnp.int32(self.pad_id), piece=self.piece, per_layer=self.per_layer)

    def advance(self) -> SlotTurns:
        """Decodes the fed slots until none decodes or `min_waiting` of them ended their turn (module notes)."""
        self._state, steps = self._advance(
            self.graphdef, self.params, self._state, self.key, jnp.float32(self.temperature),
            jnp.float32(1.0 if self.top_p is None else self.top_p), self.stop_SK, self.eos_E,
            jnp.int32(self.pad_id), jnp.int32(self.min_waiting), greedy=self.temperature == 0.0,
            top_k=None if self.top_k is None else int(self.top_k), use_top_p=self.top_p is not None,
            per_layer=self.per_layer)
        s = self._state
        decoding, lengths, stopped = (hosts.to_host(x) for x in (s.decoding_S, s.t_S, s.stopped_S))
        if self.by_host:  # the turn's tokens of the slots held here
            tokens, logp = hosts.fetch_held(s.tokens_ST, self.pad_id), hosts.fetch_held(s.logp_ST)
        else:
            tokens, logp = hosts.to_host(s.tokens_ST), hosts.to_host(s.logp_ST)
        decoding = decoding.astype(bool)
        ended = self._decoding & ~decoding & self.owned_S
        for i in np.flatnonzero(ended):  # the cache holds all but the token that ended the turn
            self._fed[i] = self._fed[i] + [int(x) for x in tokens[i, : max(int(lengths[i]) - 1, 0)]]
        steps = int(hosts.to_host(steps))
        self.stats["decode_steps"] += steps
        self.stats["slot_steps"] += steps * self.num_slots
        self.stats["advances"] += 1
        self._decoding = decoding
        return SlotTurns(ended, tokens, logp, lengths, stopped & ended, steps)
