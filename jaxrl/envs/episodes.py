"""Multi-turn episodes as training rows: `collect_episodes` (sampled), `scripted_episodes` (demonstrations).

Episode i = p·G + g (G per record, rows of one record contiguous) runs turns until its env says done, the
model emits EOS, `max_turns` is reached or the context would exceed `max_total_tokens`. The row is

    tokens_BL    = [left-padded prompt | a_1 o_1 a_2 o_2 … a_m | right padding]   (exactly the fed ids)
    loss_mask_BL = 1 on action tokens a_k (sampled), 0 on prompt, observations o_k and padding
    old_logp_BL  = the sampler's log π(a_k,t | context) on action tokens, 0 elsewhere

in the layout of `jaxrl.types.Rows` (prompt_width columns of prompt, then the completion region).
`rewards_B` is the episode return Σ_u r_u of the per-turn rewards (`turn_rewards_BU`, U turns); environments that
only score the final answer give a return equal to that final reward.

Every reset / step / demonstration is checked against the `Env` contract (`jaxrl.envs.contract`); a step that
breaks it (or raises, or runs past `step_timeout_s`) stops the rollout with `EnvError` (on_error "raise") or
ends that episode with return 0 (on_error "end_episode": `errors_B`, metric `env/errors`).

Hosts: with `row_sharding` (`jaxrl.sharding.row_sharding` of the B rows) a host runs the environments of the
rows it owns (`jaxrl.sharding.hosts.row_owners`) and no others, so a tool is called once per episode on a pod,
not once per host. The rows' tokens and log-probs are then valid at the rows this host holds (its own; also
the others' when some row sits on several hosts, whose values come from their owners); the per-row numbers
(rewards, lengths, turns, masks) are exchanged, so they and the metrics are the same on every host.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxrl.envs.base import Action, Env
from jaxrl.envs.contract import ON_ERROR, checked_reset, checked_step
from jaxrl.errors import EnvError, UserError
from jaxrl.envs.slot_episodes import SlotScheduler
from jaxrl.sampling.batching import DEFAULT_GEN_BUCKETS, SamplingSpec, bucket, check_engine
from jaxrl.sampling.episode_slots import SlotDecoder
from jaxrl.sampling.multiturn import MODES, TurnDecoder, stop_token_sequences
from jaxrl.sharding import hosts
from jaxrl.types import Rows


@dataclasses.dataclass(frozen=True)
class EpisodeBudget:
    """What bounds a multi-turn rollout beyond sampling (which `jaxrl.sampling.SamplingSpec` says: the group
    size G = `num_samples`, tokens per turn = `max_new_tokens`, temperature / top-k / top-p, and the compiled
    chunk and per-turn decode widths = `prompt_buckets` / `gen_buckets`).

    Attributes:
      max_turns: model turns per episode.
      max_total_tokens: the whole context (prompt, actions, observations) of an episode.
      cache: "reprefill" (rebuild each episode's KV cache every turn) or "continue" (keep it).
      cache_slots: the carried cache capacity in continue mode (0: max_total_tokens + max_turns · decode
        width, rounded up to a multiple of 128). Every decode step attends over all of it, so it sets the
        speed; when padding makes a turn not fit, the live episodes are re-prefilled (same results).
      row_buckets: widths of the training rows' prompt and completion regions.
      on_error: a step that breaks the contract, raises or times out: "raise" (EnvError) or "end_episode"
        (that episode ends with return 0 and counts in `Episodes.errors_B`).
      step_timeout_s: wait at most this long for one step (None: no limit, the step runs on this thread).
    """

    max_turns: int = 4
    max_total_tokens: int = 1024
    cache: str = "reprefill"
    cache_slots: int = 0
    row_buckets: tuple[int, ...] = DEFAULT_GEN_BUCKETS
    on_error: str = "raise"
    step_timeout_s: float | None = None

    def __post_init__(self):
        if self.on_error not in ON_ERROR:
            allowed = ", ".join(map(repr, ON_ERROR))
            raise ValueError(f"on_error={self.on_error!r}: allowed values are {allowed}")
        if self.step_timeout_s is not None and not float(self.step_timeout_s) > 0:
            raise ValueError(f"step_timeout_s must be > 0 or None, got {self.step_timeout_s}")
        if self.cache not in MODES:
            raise ValueError(f"cache={self.cache!r}: allowed values are {', '.join(map(repr, MODES))}")
        for name in ("max_turns", "max_total_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclasses.dataclass
class Episodes:
    """N episodes as host arrays (row n = p·G + g); field names follow `jaxrl.types.Rollout` if shared.

    `prompts`, `completions` and `turn_info` are valid at the rows this host drove (`driven_B`; "" and []
    elsewhere), `tokens_BL` and `old_logp_BL` at the rows it holds (pad and 0 elsewhere); every other field
    is the same on every host."""

    tokens_BL: np.ndarray  # int32 [B, L], L = prompt_width + completion width
    mask_BL: np.ndarray  # bool, real tokens
    loss_mask_BL: np.ndarray  # bool, sampled action tokens only
    old_logp_BL: np.ndarray  # float32, sampler log-probs on action tokens, 0 elsewhere
    prompt_width: int
    rewards_B: np.ndarray  # float32 episode return
    turn_rewards_BU: np.ndarray  # float32 [B, U] per-turn rewards (0 after the last turn)
    turns_B: np.ndarray  # int32 model turns
    tool_calls_B: np.ndarray  # int32
    tool_errors_B: np.ndarray  # int32
    obs_tokens_B: np.ndarray  # int32 observation tokens fed after the prompt
    action_tokens_B: np.ndarray  # int32 sampled tokens
    lengths_B: np.ndarray  # int32 completion-region length (actions + observations)
    finished_B: np.ndarray  # bool, ended by the env or EOS (False: cut by a turn or token budget)
    records: list[dict[str, Any]]  # the record of each episode (repeated G times)
    prompts: list[str]
    completions: list[str]  # readable transcript of the completion region (special tokens kept)
    turn_info: list[list[dict[str, Any]]]  # the env's info of every turn
    metrics: dict[str, float]
    driven_B: np.ndarray | None = None  # bool, the rows this host drove (None: all)
    row_sharding: Any = None  # the rows' layout when hosts drove their own rows (`collect_episodes`)
    errors_B: np.ndarray | None = None  # bool, ended by an environment error (on_error "end_episode")
    first_error: str = ""  # the first such error of this host's episodes

    @property
    def completion_mask_BT(self) -> np.ndarray:
        return self.loss_mask_BL[:, self.prompt_width:]

    def rows(self, role: str = "") -> Rows:
        """The episodes as the middle's `Rows` (completion space: the sampled action tokens are trained, the
        environment's observation tokens are real but not trained), host arrays."""
        w = self.prompt_width
        return Rows(self.tokens_BL, self.mask_BL, self.loss_mask_BL[:, w:], self.old_logp_BL[:, w:],
                    self.lengths_B.astype(np.int32), self.finished_B, list(self.completions), role=role)


@dataclasses.dataclass
class _Episode:
    env: Env
    index: int  # the record's index in the batch (for error messages)
    prompt: list[int]
    context: list[int]
    logp: list[float]
    sampled: list[bool]
    rewards: list[float] = dataclasses.field(default_factory=list)
    info: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    done: bool = False
    finished: bool = False
    error: str = ""  # the environment error that ended the episode (on_error "end_episode")

    def act(self, ids: Sequence[int], logp: Sequence[float], action: Action, budget: EpisodeBudget,
            vocab: int) -> None:
        """Appends an action, steps the env (checked) and appends its observation unless the episode ends."""
        self.context += ids
        self.logp += logp
        self.sampled += [True] * len(ids)
        try:
            obs, reward, done, info = checked_step(self.env, action, self.index, len(self.rewards) + 1, vocab,
                                                   budget.step_timeout_s)
        except EnvError as e:
            if budget.on_error == "raise":
                raise
            self.rewards = [0.0] * (len(self.rewards) + 1)  # the episode's return is 0
            self.info.append({"env_error": str(e)})
            self.error, self.done = str(e), True
            return
        self.rewards.append(reward)
        self.info.append(info)
        self.finished = bool(done or action.eos)
        max_turns, max_total = budget.max_turns, budget.max_total_tokens
        no_room = len(self.context) + len(obs) >= max_total
        self.done = self.finished or len(self.rewards) >= max_turns or no_room
        if not self.done:
            self.context += obs
            self.logp += [0.0] * len(obs)
            self.sampled += [False] * len(obs)


def _start(env_factory: Callable[[Any], Env], records, tokenizer, budget: EpisodeBudget, group_size: int,
           row_sharding=None) -> tuple[list, list]:
    """The repeated records and an episode per row (None for the rows this host does not drive)."""
    rep = [r for r in records for _ in range(group_size)]
    owners = None if row_sharding is None else hosts.row_owners(row_sharding, (len(rep),))
    eps = []
    for i, r in enumerate(rep):
        if owners is not None and owners[i] != jax.process_index():
            eps.append(None)
            continue
        env = env_factory(tokenizer)
        prompt = checked_reset(env, r, i // group_size, len(tokenizer))
        if len(prompt) >= budget.max_total_tokens:
            raise UserError(f"the prompt of record {i // group_size} has {len(prompt)} tokens; "
                            f"max_total_tokens={budget.max_total_tokens} leaves no room for an action")
        eps.append(_Episode(env, i // group_size, prompt, list(prompt), [0.0] * len(prompt),
                            [False] * len(prompt)))
    return rep, eps


def collect_episodes(graphdef, params, records: Sequence[dict[str, Any]], tokenizer,
                     env_factory: Callable[[Any], Env], budget: EpisodeBudget, sampling: SamplingSpec, seed, *,
                     row_offset: int = 0, row_sharding=None) -> Episodes:
    """Runs G episodes per record: with `sampling.engine` "static" all live episodes decode each turn together
    (`TurnDecoder`, cache policy `budget.cache`); with "continuous", `sampling.slots` decode slots (None: one
    per episode) each hold an episode and its KV cache across its turns, a finished episode's slot taken by the
    next one (`jaxrl.envs.slot_episodes`; the tokens of the static engine with cache "continue"). With
    `row_sharding` each host drives its own episodes in either engine: in the continuous one it admits them into
    the slots it owns.

    Args:
      graphdef, params: `nnx.split(model)` of a `jaxrl.models.Transformer`.
      records: P dataset records (whatever the env's `reset` reads).
      tokenizer: the model's HF tokenizer (eos and pad ids, decoding of actions).
      env_factory: `tokenizer -> Env`, e.g. `jaxrl.envs.make_env(name, params)`; one env per episode.
      budget: turns, tokens, cache policy and failure handling (`EpisodeBudget`).
      sampling: G = `num_samples` episodes per record, `max_new_tokens` per turn, temperature / top-k / top-p,
        chunk and decode widths (`prompt_buckets`, `gen_buckets`).
      seed: int or PRNG key of this rollout.
      row_offset: global index of this call's first episode (its row id for the random draws).
      row_sharding: the layout of the B rows (`jaxrl.sharding.row_sharding`, as the model pins them): each
        host drives its own rows' episodes (module notes). None: every host drives every episode.

    Returns:
      Episodes with B = P·G rows.
    """
    for name in ("num_samples", "max_new_tokens"):
        if int(getattr(sampling, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(sampling, name)}")
    continuous = sampling.engine == "continuous"
    num = len(records) * int(sampling.num_samples)
    shards = 1 if row_sharding is None else hosts.row_blocks(row_sharding, num)
    slots = check_engine("continuous", sampling.slots, num, shards) if continuous else 0
    rep, eps = _start(env_factory, records, tokenizer, budget, sampling.num_samples, row_sharding)
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id)
    probe = next((e.env for e in eps if e is not None), None) or env_factory(tokenizer)
    stops = stop_token_sequences(tokenizer, probe.stop_strings)
    sampler = dict(max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_k=sampling.top_k,
                   top_p=sampling.top_p, eos_ids=(eos,), stop_sequences=stops, pad_id=pad, seed=seed,
                   gen_buckets=sampling.gen_buckets)
    rows = range(row_offset, row_offset + len(eps))

    def act(e: _Episode, ids: list[int], logp: list[float]) -> None:
        action = Action(tuple(ids), tokenizer.decode(ids, skip_special_tokens=True), ids[-1] == eos)
        e.act(ids, logp, action, budget, len(tokenizer))

    if continuous:  # S slots, each episode's KV cache kept across its turns (`jaxrl.envs.slot_episodes`)
        by_host = row_sharding is not None  # each host: its own episodes in its own slots
        decoder = SlotDecoder(graphdef, params, slots, max_context=budget.max_total_tokens, by_host=by_host,
                              **sampler)
        scheduler = SlotScheduler(decoder, eps, rows, max_new_tokens=sampling.max_new_tokens,
                                  max_total_tokens=budget.max_total_tokens)
        scheduler.run(lambda i, ids, logp: act(eps[i], ids, logp))
        sampled = sum(sum(e.sampled) for e in eps if e is not None)
        sampled = int(hosts.sum_across_hosts(np.asarray(sampled, np.int64))) if by_host else sampled
        stats = {"time/generate_s": scheduler.timing["generate_s"], "time/env_s": scheduler.timing["env_s"],
                 "rollout/prefill_tokens": float(decoder.prefill_tokens()), "rollout/cache_compactions": 0.0,
                 "rollout/decode_steps": float(decoder.stats["decode_steps"]),
                 "rollout/slot_use": sampled / max(decoder.stats["slot_steps"], 1)}
    else:
        stats = _lockstep(graphdef, params, eps, budget, sampling, sampler, rows, row_sharding, act)
    out = _assemble(eps, rep, tokenizer, budget, row_sharding)
    out.metrics.update(stats)
    return out


def _lockstep(graphdef, params, eps: list, budget: EpisodeBudget, sampling: SamplingSpec, sampler: dict, rows,
              row_sharding, act) -> dict[str, float]:
    """All live episodes decode each turn together (`TurnDecoder`); returns the rollout's timing metrics."""
    gen_width = bucket(sampling.max_new_tokens, sampling.gen_buckets, "completion")
    slots = budget.cache_slots or -(-(budget.max_total_tokens + budget.max_turns * gen_width) // 128) * 128
    decoder = TurnDecoder(graphdef, params, len(eps), mode=budget.cache, rows=rows, cache_slots=slots,
                          row_sharding=row_sharding, chunk_buckets=sampling.prompt_buckets, **sampler)
    gen_s = env_s = 0.0
    mine = [e for e in eps if e is not None]
    for k in range(budget.max_turns):
        budgets = [0 if e is None or e.done
                   else min(sampling.max_new_tokens, budget.max_total_tokens - len(e.context)) for e in eps]
        for e, b in zip(eps, budgets):
            if e is not None:
                e.done = e.done or b <= 0
        all_done = all(e.done for e in mine)
        if all_done if row_sharding is None else hosts.agree(all_done):
            break
        t0 = time.perf_counter()
        turn = decoder.turn(k, [None if e is None or e.done else e.context for e in eps], budgets)
        t1 = time.perf_counter()
        gen_s += t1 - t0
        for i, e in enumerate(eps):
            n = int(turn.lengths[i])
            if e is None or e.done or n == 0:
                continue
            act(e, [int(x) for x in turn.tokens[i, :n]], [float(x) for x in turn.logprobs[i, :n]])
        env_s += time.perf_counter() - t1
    return {"time/generate_s": gen_s, "time/env_s": env_s,
            "rollout/prefill_tokens": float(decoder.prefill_tokens()),
            "rollout/cache_compactions": float(decoder.stats["compactions"])}


def scripted_episodes(records: Sequence[dict[str, Any]], tokenizer, env_factory: Callable[[Any], Env],
                      policy: Callable[[dict[str, Any]], Sequence[str]], budget: EpisodeBudget, *,
                      group_size: int = 1, row_sharding=None) -> Episodes:
    """Episodes whose actions are given texts (demonstrations for an SFT warm start; oracle tests).

    Action k of record r is `policy(r)[k]`, tokenized alone (no EOS: a stop string such as `</answer>` ends
    the turn, as in sampling). old_logp_BL is 0 (no sampler). Budgets as in `collect_episodes`, so the rows
    look exactly like sampled ones; `group_size` episodes per record. `row_sharding`: as in
    `collect_episodes` (each host plays its own rows).
    """
    rep, eps = _start(env_factory, records, tokenizer, budget, group_size, row_sharding)
    eos = int(tokenizer.eos_token_id)
    for r, e in zip(rep, eps):
        if e is None:
            continue
        actions = policy(r)
        if isinstance(actions, (str, bytes)) or not isinstance(actions, Sequence) or \
                not all(isinstance(a, str) for a in actions):
            raise EnvError(f"the demonstration policy of {type(e.env).__name__} (record {e.index}) returned "
                           f"{actions!r:.60}; expected a list of action texts (list[str])")
        for text in actions:
            if e.done:
                break
            ids = [int(x) for x in tokenizer.encode(text, add_special_tokens=False)]
            room = budget.max_total_tokens - len(e.context)
            ids = ids[: max(room, 0)]
            if not ids:
                e.done = True
                break
            action = Action(tuple(ids), tokenizer.decode(ids, skip_special_tokens=True), ids[-1] == eos)
            e.act(ids, [0.0] * len(ids), action, budget, len(tokenizer))
    return _assemble(eps, rep, tokenizer, budget, row_sharding)


def _assemble(eps: list, rep: list[dict[str, Any]], tokenizer, budget: EpisodeBudget,
              row_sharding=None) -> Episodes:
    """The rows of `eps` (None: a row another host drove). With `row_sharding` the widths and every per-row
    number come from all hosts (each row from its owner), so they are the same everywhere."""
    pad = int(tokenizer.pad_token_id)
    n = len(eps)
    mine = [e for e in eps if e is not None]
    longest = max((len(e.prompt) for e in mine), default=1)
    longest_completion = max((len(e.context) - len(e.prompt) for e in mine), default=1)
    if row_sharding is not None:
        longest, longest_completion = (hosts.max_across_hosts(v) for v in (longest, longest_completion))
    width = bucket(longest, budget.row_buckets, "prompt")
    comp = bucket(max(longest_completion, 1), budget.row_buckets, "completion")
    tokens = np.full((n, width + comp), pad, np.int32)
    mask = np.zeros((n, width + comp), bool)
    loss_mask = np.zeros((n, width + comp), bool)
    old_logp = np.zeros((n, width + comp), np.float32)
    turn_rewards = np.zeros((n, budget.max_turns), np.float32)
    # turns, tool calls, tool errors, action tokens, length, finished, ended by an error
    per_row = np.zeros((n, 7), np.int32)
    for i, e in enumerate(eps):
        if e is None:
            continue
        p, c = len(e.prompt), len(e.context)
        cols = slice(width - p, width - p + c)
        tokens[i, cols], mask[i, cols] = e.context, True
        loss_mask[i, cols], old_logp[i, cols] = e.sampled, e.logp
        turn_rewards[i, : len(e.rewards)] = e.rewards
        per_row[i] = (len(e.rewards), sum(int(x.get("tool_calls", 0)) for x in e.info),
                      sum(int(x.get("tool_errors", 0)) for x in e.info), sum(e.sampled), c - p, e.finished,
                      bool(e.error))
    driven = None
    if row_sharding is not None:  # the small per-row arrays from each row's owner
        driven = np.asarray([e is not None for e in eps])
        owners = hosts.row_owners(row_sharding, (n,))
        mask, loss_mask, turn_rewards, per_row = (hosts.gather_owned(x, owners)
                                                  for x in (mask, loss_mask, turn_rewards, per_row))
        if hosts.shared_rows(row_sharding, (n,)):  # a row on several hosts: its holders need its tokens
            tokens, old_logp = (hosts.gather_owned(x, owners) for x in (tokens, old_logp))
    turns, tool_calls, tool_errors, action_tokens, lengths, finished, errors = per_row.T
    out = Episodes(
        tokens, mask, loss_mask, old_logp, width, turn_rewards.sum(axis=1), turn_rewards, turns, tool_calls,
        tool_errors, lengths - action_tokens, action_tokens, lengths, finished.astype(bool), list(rep),
        ["" if e is None else tokenizer.decode(e.prompt) for e in eps],
        ["" if e is None else tokenizer.decode(e.context[len(e.prompt):]) for e in eps],
        [[] if e is None else e.info for e in eps], {}, driven, row_sharding, errors.astype(bool),
        next((e.error for e in mine if e.error), ""),
    )
    out.metrics.update({
        "reward/mean": float(out.rewards_B.mean()), "episode/turns": float(out.turns_B.mean()),
        "episode/tool_calls": float(out.tool_calls_B.mean()),
        "episode/tool_errors": float(out.tool_errors_B.mean()),
        "episode/obs_tokens": float(out.obs_tokens_B.mean()),
        "episode/action_tokens": float(action_tokens.mean()),
        "episode/finished_frac": float(out.finished_B.mean()),
        "env/errors": float(errors.sum()),
    })
    return out
