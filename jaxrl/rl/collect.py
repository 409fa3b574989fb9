"""The `Collector` plug-in: how the rows of a step are produced.

    SingleTurn    G completions per prompt, scored                          (`sample_and_score`)
                  (partial rollouts: `first_segment`, then its `Continuation`: `jaxrl.rl.partial`)
    EnvEpisodes   G multi-turn episodes per record in an environment         (`jaxrl.rl.agentic.collect_env`)
    SystemRows    a multi-agent system's trained roles' rows, role segments  (`jaxrl.multi_agent`)

Setup (`jaxrl.rl.setup.setup`) builds one; the step, the SFT warm start and the evaluation call it without
asking which one they got. Besides the rows, a collector owns

* what the SFT warm start imitates (`demonstrations`: rows laid out like the ones it samples; None = the
  records' reference targets, `jaxrl.algorithms.expert_rows`),
* the check that the records suit it (`check_records`, at setup: a system's questions must be over its world),
* its host-side state that checkpoints carry (`state_json` / `load_state`, under `extra["stages"][name]`:
  SSP's problem pool under "ssp"; None = nothing to carry).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import numpy as np

from jaxrl import rewards as rewards_lib
from jaxrl.rl import agentic
from jaxrl.envs import EpisodeBudget
from jaxrl.rewards.rows import score_rows
from jaxrl.sampling import Generation, SamplingSpec, generate_from_state
from jaxrl.sampling.rollout_rows import decode, device_sequences
from jaxrl.sharding import hosts
from jaxrl.types import Rollout, Rows
from jaxrl.learner.train_step import TrainBatch

Records = Sequence[Mapping[str, Any]]
# (records, row_sharding=None) -> expert rows laid out like the rows the collector samples, SFT weight 1
Demonstrations = Callable[..., TrainBatch]
RowLayout = Callable[[int], Any]  # rows -> the rows' sharding (`jaxrl.sharding.row_sharding` of the mesh)


class Collector(Protocol):
    """Produces a step's rollout; owns its demonstrations, its record check and its checkpointed state."""

    name: str  # the key of its state in checkpoints (`extra["stages"]`)
    segments: bool  # its rows carry role segments (`Rollout.segment_B`): they update unshared

    def __call__(self, params, records: Records, spec: SamplingSpec, key, *,
                 train: bool) -> Rollout: ...

    def demonstrations(self) -> Demonstrations | None: ...

    def check_records(self, records: Records, split: str) -> None: ...

    def state_json(self) -> Any: ...

    def load_state(self, data) -> None: ...


class System(Protocol):
    """What a multi-agent system (`jaxrl.multi_agent.SYSTEMS`) declares; setup and `SystemRows` read it."""

    name: str  # the key of its state in checkpoints
    max_turns: int  # its warm-start demonstration episodes' turns (`demonstration_budget`)
    max_total_tokens: int | None  # their token budget; None: the rollout's longest prompt bucket + completion
    adapter_roles: Sequence[str]  # its roles in id order (role segment = index; per-role adapters)
    adapter_aliases: Mapping[str, str]  # a role played with another's adapters
    update_phases: tuple[int, ...]  # role ids in update order (`jaxrl.rl.update.Phased`); () = joint

    def collect(self, graphdef, params, records: Records, rewards, spec: SamplingSpec, key, *,
                train: bool) -> Rollout: ...

    def group_sizes(self, group_size: int) -> dict[str, int]: ...

    def check_records(self, records: Records, split: str) -> None: ...

    def demonstration_env(self, tokenizer) -> Any: ...

    def state_json(self) -> Any: ...

    def load_state(self, data) -> None: ...


class _Stateless:
    """Defaults: no role segments, the records' reference targets as demonstrations, any records, nothing to
    checkpoint."""

    segments = False

    def demonstrations(self) -> Demonstrations | None:
        return None

    def check_records(self, records: Records, split: str) -> None:
        del records, split

    def state_json(self) -> Any:
        return None

    def load_state(self, data) -> None:
        del data


def _episode_demonstrations(tokenizer, env_factory, budget: EpisodeBudget) -> Demonstrations:
    """An environment's `demonstration(record)` episodes as expert rows (`agentic.demonstration_rows`)."""

    def rows(records: Records, row_sharding=None) -> TrainBatch:
        return agentic.demonstration_rows(records, tokenizer, env_factory, budget, row_sharding=row_sharding)

    return rows


class SingleTurn(_Stateless):
    """G completions per prompt on the jitted sampler, decoded and scored (`spec.num_samples` = G)."""

    name = "single_turn"

    def __init__(self, graphdef, tokenizer, rewards: rewards_lib.Rewards):
        self.graphdef, self.tokenizer, self.rewards = graphdef, tokenizer, rewards

    def __call__(self, params, records: Records, spec: SamplingSpec, key, *,
                 train: bool) -> Rollout:
        del train  # training and evaluation rows are collected alike
        return sample_and_score(self.graphdef, params, records, self.tokenizer, self.rewards, spec, seed=key)

    def first_segment(self, params, records: Records, spec: SamplingSpec, key, split: int) -> Sampled:
        """Partial rollouts' first segment (`jaxrl.rl.partial`): the rows of `__call__` under the same key,
        each stopped after at most `split` tokens (the same first tokens as the whole rows)."""
        budget_B = np.full(len(records) * spec.num_samples, min(split, spec.max_new_tokens), np.int32)
        return sample(self.graphdef, params, records, self.tokenizer, spec, key, max_new_per_row=budget_B)

    def continuation(self, first: Sampled, split: int) -> "Continuation":
        """The collector that finishes `first` (cut at `split` tokens) under the parameters it is given."""
        return Continuation(self, first, split)


class Continuation:
    """A collector call that continues a first segment (`SingleTurn.first_segment`) under the parameters it
    is given and scores the whole rows: partial rollouts' second segment (`jaxrl.rl.partial`). Its draws use
    fold_in(key, 1), so they never repeat the first segment's."""

    def __init__(self, owner: SingleTurn, first: Sampled, split: int):
        self.owner, self.first, self.split = owner, first, split

    def __call__(self, params, records: Records, spec: SamplingSpec, key, *, train: bool) -> Rollout:
        del train
        o = self.owner
        whole = resume(o.graphdef, params, self.first, o.tokenizer, spec, jax.random.fold_in(key, 1), self.split)
        return score(whole, records, o.tokenizer, o.rewards, spec)


@dataclasses.dataclass
class Sampled:
    """The sampler's rows of a step before they are decoded and scored: the records' prompts, the generation
    (device arrays), its lengths and finished flags read back (gathered on every host) and the seconds it
    took. Partial rollouts (`jaxrl.rl.partial`) continue one under newer weights before scoring it."""

    prompt_ids: list
    gen: Generation
    lengths_B: np.ndarray
    finished_B: np.ndarray
    seconds: float


def sample(graphdef, params, records: Records, tokenizer, spec: SamplingSpec, seed,
           max_new_per_row=None) -> Sampled:
    """Stage 1 of `sample_and_score`: G completions per record on the jitted sampler (rows r = p·G + g),
    each row stopping at its EOS or its budget (`max_new_per_row`, default `spec.max_new_tokens`)."""
    prompt_ids = [r["prompt_ids"] for r in records]
    t0 = time.perf_counter()
    gen = generate_from_state(graphdef, params, prompt_ids, spec, eos_ids=(int(tokenizer.eos_token_id),),
                              seed=seed, pad_id=int(tokenizer.pad_token_id), max_new_per_row=max_new_per_row)
    lengths = hosts.to_host(gen.lengths)  # per-row scalars: gathered
    finished = hosts.to_host(gen.finished)
    return Sampled(prompt_ids, gen, lengths, finished, time.perf_counter() - t0)


def continuing_rows(first: Sampled, split: int, total: int) -> np.ndarray:
    """[B] bool: the rows of a first segment cut at `split` of `total` tokens that decode on (no EOS yet)."""
    return ~first.finished_B & (first.lengths_B >= split) & (split < total)


def resume(graphdef, params, first: Sampled, tokenizer, spec: SamplingSpec, seed, split: int) -> Sampled:
    """`first` with its rows that stopped at `split` tokens without an EOS decoded on under `params`, up to
    `spec.max_new_tokens` in all (partial rollouts, `jaxrl.rl.partial`).

    Re-prefill (as slime's SGLang-based partial rollouts do): each row's prompt + first segment is the prompt
    of one row (G = 1; row r keeps its index, so its draws are fold_in(fold_in(seed, t), r) and do not depend
    on the layout). Rows already done ride along with a budget of 1 token that is dropped, so the program's
    shape does not depend on how many continue. The merged tokens and log-probs (each token's log-prob under
    the version that sampled it) are placed like the first segment's arrays.
    """
    total = spec.max_new_tokens
    going_B = continuing_rows(first, split, total)
    if not going_B.any():
        return first
    g, pad_id = spec.num_samples, int(tokenizer.pad_token_id)
    tokens_BT, logp_BT = np.array(hosts.to_host(first.gen.tokens)), np.array(hosts.to_host(first.gen.logprobs))
    prompts = [list(first.prompt_ids[r // g]) + tokens_BT[r, :n].tolist() for r, n in enumerate(first.lengths_B)]
    rest = total - split
    shifted = None if spec.prompt_buckets is None else tuple(b + split for b in spec.prompt_buckets)
    spec_rest = dataclasses.replace(spec, max_new_tokens=rest, num_samples=1, prompt_buckets=shifted)
    t0 = time.perf_counter()
    gen = generate_from_state(graphdef, params, prompts, spec_rest, eos_ids=(int(tokenizer.eos_token_id),),
                              seed=seed, pad_id=pad_id, max_new_per_row=np.where(going_B, rest, 1))
    rows = np.flatnonzero(going_B)
    tokens_BT[rows, split:] = hosts.to_host(gen.tokens)[rows]
    logp_BT[rows, split:] = hosts.to_host(gen.logprobs)[rows]
    lengths_B = np.where(going_B, split + hosts.to_host(gen.lengths), first.lengths_B).astype(np.int32)
    finished_B = np.where(going_B, hosts.to_host(gen.finished), first.finished_B)
    seconds = time.perf_counter() - t0
    place = lambda x, like: hosts.host_to_global(x, like.sharding)
    merged = Generation(tokens=place(tokens_BT, first.gen.tokens), lengths=place(lengths_B, first.gen.lengths),
                        logprobs=place(logp_BT, first.gen.logprobs), finished=place(finished_B, first.gen.finished),
                        prompt_index=first.gen.prompt_index,
                        decode_steps=np.int32(int(first.gen.decode_steps) + int(gen.decode_steps)))
    return Sampled(first.prompt_ids, merged, lengths_B, finished_B, seconds)


def score(sampled: Sampled, records: Records, tokenizer, rewards, spec: SamplingSpec) -> Rollout:
    """Stage 2 of `sample_and_score`: the rows of `sampled` as a rollout, decoded and scored."""
    gen, lengths, finished = sampled.gen, sampled.lengths_B, sampled.finished_B
    pad_id = int(tokenizer.pad_token_id)
    g = spec.num_samples
    t0 = time.perf_counter()
    tokens, mask, cmask, old_logp = device_sequences(sampled.prompt_ids, gen, g, pad_id, spec.prompt_buckets,
                                                     lengths)
    rep = [r for r in records for _ in range(g)]
    owners = hosts.row_owners(gen.tokens.sharding, tuple(gen.tokens.shape))
    mine = np.flatnonzero(owners == jax.process_index())  # the rows this host decodes and scores
    completions = [""] * len(rep)
    own_BT = hosts.fetch_held(gen.tokens)[mine]  # this host's devices only
    for i, text in zip(mine, decode(tokenizer, own_BT, lengths[mine])):
        completions[i] = text
    t1 = time.perf_counter()  # the sampler's tokens were read back and decoded
    rewards_BR, info = score_rows(rewards, [r["prompt"] for r in rep], completions, rep, lengths, owners)
    metrics = dict(info.metrics)
    # stage times of the step's breakdown (`jaxrl.rl.step` moves them out of the rollout's metrics)
    metrics.update({"time/generation": sampled.seconds + t1 - t0, "time/reward": time.perf_counter() - t1})
    metrics["response_length/mean"] = float(lengths.mean())
    metrics["response_length/max"] = float(lengths.max())
    metrics["response/finished_frac"] = float(finished.mean())
    # the decode loop's iterations and the share of its row-steps (slots x steps) that made a token: a static
    # batch with long-tailed lengths wastes the rest (`rollout.engine`, jaxrl.sampling.continuous)
    steps = int(gen.decode_steps)
    metrics["rollout/decode_steps"] = float(steps)
    metrics["rollout/slot_use"] = float(lengths.sum()) / max(steps * (spec.slots or len(lengths)), 1)
    return Rollout.of(Rows(tokens, mask, cmask, old_logp, lengths, finished, completions), records=rep,
                      rewards_BR=rewards_BR, weights_R=info.weights_R, reward_names=info.names, metrics=metrics,
                      score_infos=(info,), pad_id=pad_id)


def sample_and_score(graphdef, params, records: Records, tokenizer, rewards, spec: SamplingSpec, seed) -> Rollout:
    """Samples, decodes and scores G completions for each record (`prompt_ids` from the data encoder):
    `score(sample(...))`.

    Multi-host (tpu/README.md, "How a step is split across hosts"): every host calls it with the same global
    batch of prompts; the sampler runs once over all devices. Each row has one owner host
    (`jaxrl.sharding.hosts.row_owners`: the lowest process holding it), which alone decodes and scores it from
    its own devices; the reward matrix, lengths and error counts are then gathered, so every host takes the
    same decisions. Tokens and log-probs stay on the devices (`rollout_rows.device_sequences`);
    `completions` holds the text of this host's own rows ("" elsewhere).

    Args:
      rewards: the resolved rewards (`jaxrl.rewards.resolve`), built once per run.
    """
    sampled = sample(graphdef, params, records, tokenizer, spec, seed)
    return score(sampled, records, tokenizer, rewards, spec)


class EnvEpisodes(_Stateless):
    """G episodes per record in a multi-turn environment (`jaxrl.envs`), each host driving the episodes of
    the rows it holds (`row_layout`); the environment's `demonstration(record)` episodes are the warm
    start's."""

    name = "env_episodes"

    def __init__(self, graphdef, tokenizer, rewards: rewards_lib.Rewards, env_factory,
                 budget: EpisodeBudget, row_layout: RowLayout | None):
        self.graphdef, self.tokenizer, self.rewards = graphdef, tokenizer, rewards
        self.env_factory, self.budget, self.row_layout = env_factory, budget, row_layout

    def __call__(self, params, records: Records, spec: SamplingSpec, key, *,
                 train: bool) -> Rollout:
        del train
        return agentic.collect_env(self.graphdef, params, records, self.tokenizer, self.rewards,
                                   self.env_factory, self.budget, spec, key, row_layout=self.row_layout)

    def demonstrations(self) -> Demonstrations:
        return _episode_demonstrations(self.tokenizer, self.env_factory, self.budget)


class SystemRows:
    """A multi-agent system (`System`): its `collect` gives the trained roles' rows, one role segment each,
    under the run's sampling spec (`train`), and its evaluation rows under any other. Its role-format
    demonstrations (`system.demonstration_env`, one episode per record, `demonstration_budget`) are the warm
    start's; its records must be over its world; its state (SSP's pool) is checkpointed under
    `system.name`."""

    segments = True

    def __init__(self, system: System, graphdef, tokenizer, rewards: rewards_lib.Rewards,
                 sampling: SamplingSpec):
        self.system, self.name = system, system.name
        self.graphdef, self.tokenizer, self.rewards = graphdef, tokenizer, rewards
        self.demo_budget = demonstration_budget(system, sampling)

    def __call__(self, params, records: Records, spec: SamplingSpec, key, *,
                 train: bool) -> Rollout:
        return self.system.collect(self.graphdef, params, records, self.rewards, spec, key, train=train)

    def demonstrations(self) -> Demonstrations:
        return _episode_demonstrations(self.tokenizer, self.system.demonstration_env, self.demo_budget)

    def check_records(self, records: Records, split: str) -> None:
        self.system.check_records(records, split)

    def state_json(self) -> Any:
        return self.system.state_json()

    def load_state(self, data) -> None:
        self.system.load_state(data)


def demonstration_budget(system: System, sampling: SamplingSpec) -> EpisodeBudget:
    """The episodes of a system's role-format demonstrations: one per record, laid out like the rows it
    samples under `sampling` (the run's), with the system's `max_turns` and `max_total_tokens` (None: the
    longest prompt bucket + the completion)."""
    prompts, gens = sampling.prompt_buckets or (), sampling.gen_buckets or ()
    total = system.max_total_tokens
    if total is None:
        total = max(prompts or (1024,)) + sampling.max_new_tokens
    buckets = {"row_buckets": tuple(sorted({*prompts, *gens, total}))} if prompts else {}
    return EpisodeBudget(max_turns=system.max_turns, max_total_tokens=total, **buckets)
