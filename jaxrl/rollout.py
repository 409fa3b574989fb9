"""From a batch of prompts to a scored rollout in completion space.

`collect(...)` samples G completions per prompt with `jaxrl.sampling`, decodes and scores them with the
resolved rewards, and lays the result out for the train step:

    tokens_BL = [left-padded prompt | completion, padded after EOS]     (L = prompt bucket W + T)
    mask_BL   = real tokens (the forward pass's attention mask)
    completion_mask_BT = completion tokens that are trained on (incl. EOS)   [B, T], T = completion width
    old_logp_BT        = the sampler's log-probs of the completion tokens (0 elsewhere)

Only the forward pass sees full sequences; everything the loss reads is `[B, T]`, aligned with the
completion tokens `tokens_BL[:, W:]`.

Everything here is host-side glue around jitted functions (the sampler); nothing is traced.

Multi-host (tpu/README.md, "How a step is split across hosts"): every host calls `collect` with the same
global batch of prompts; the sampler runs once over all devices. Each row of the output has one owner host
(`jaxrl.sharding.hosts.row_owners`: the lowest process holding it): the owner alone decodes and scores it,
reading the rows from its own devices, and the reward matrix, lengths and error counts are then gathered, so
every host takes the same decisions. The sampled tokens and their log-probs never leave the devices:
`tokens_BL` and `old_logp_BT` of `collect` are global `jax.Array`s split over the batch axis like the
sampler's output, and the stages that move rows (DAPO, mini-batches) do it on the devices
(`jaxrl.sharding.rows`). The masks, derived from the prompt lengths and the gathered completion lengths, are
host arrays, the same on every host; `completions` holds the text of this host's own rows ("" elsewhere).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.rewards.rows import score_rows
from jaxrl.sampling import Generation, SamplingSpec, generate_from_state, pad_prompts
from jaxrl.sharding import hosts, rows as rows_lib


@dataclasses.dataclass
class Rollout:
    """One rollout batch of N = P * G samples (rows of a prompt contiguous). `tokens_BL` and `old_logp_BT`
    are numpy arrays or global jax.Arrays (single-turn `collect`: the rows stay on the devices)."""

    tokens_BL: np.ndarray
    mask_BL: np.ndarray
    completion_mask_BT: np.ndarray
    old_logp_BT: np.ndarray
    rewards_NK: np.ndarray
    weights_K: np.ndarray
    reward_names: tuple[str, ...]
    records: list[dict[str, Any]]  # the prompt's record, repeated G times
    completions: list[str]
    lengths_N: np.ndarray
    finished_N: np.ndarray
    metrics: dict[str, float]
    score_infos: tuple = ()  # the `jaxrl.rewards.ScoreInfo` of each scoring call (one per DAPO round)
    # Segments (a multi-agent system's roles): rows with equal `segment_N` are normalised together, in groups
    # of `segment_sizes[id]` consecutive rows of that segment; None: one segment, the run's group size.
    segment_N: np.ndarray | None = None
    segment_sizes: tuple[int, ...] = ()
    pad_id: int | None = None  # the token written where `mask_BL` is off (None: not recorded)

    @property
    def prompt_width(self) -> int:
        return self.tokens_BL.shape[1] - self.completion_mask_BT.shape[1]

    def add_reward_column(self, values_N: np.ndarray, name: str) -> "Rollout":
        """A copy with one more reward column of weight 1 (a shaping stage's output)."""
        return dataclasses.replace(
            self, rewards_NK=np.concatenate([self.rewards_NK, values_N[:, None].astype(np.float32)], axis=1),
            weights_K=np.concatenate([self.weights_K, np.ones((1,), np.float32)]),
            reward_names=(*self.reward_names, name))


def sequences(prompt_ids: Sequence[Sequence[int]], gen: Generation, group_size: int, pad_id: int,
              prompt_buckets: Sequence[int] | None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tokens_BL, mask_BL, completion_mask_BT, old_logp_BT) of a generation (host arrays)."""
    prompt_PL, pmask_PL = pad_prompts(prompt_ids, prompt_buckets, pad_id)
    tokens_BT = hosts.to_host(gen.tokens)
    cmask_BT = np.arange(tokens_BT.shape[1])[None, :] < hosts.to_host(gen.lengths)[:, None]
    tokens = np.concatenate([np.repeat(prompt_PL, group_size, axis=0), np.where(cmask_BT, tokens_BT, pad_id)],
                            axis=1).astype(np.int32)
    mask = np.concatenate([np.repeat(pmask_PL, group_size, axis=0), cmask_BT], axis=1)
    old_logp = np.where(cmask_BT, hosts.to_host(gen.logprobs), 0.0).astype(np.float32)
    return tokens, mask, cmask_BT, old_logp


@functools.partial(jax.jit, static_argnames="pad_id")
def _join(prompt_BW, tokens_BT, logp_BT, lengths_B, *, pad_id: int):
    """[prompt | completion padded after its end] and the completion's log-probs (0 after its end)."""
    cmask_BT = jnp.arange(tokens_BT.shape[1])[None, :] < lengths_B[:, None]
    tokens_BL = jnp.concatenate([prompt_BW, jnp.where(cmask_BT, tokens_BT, pad_id)], axis=1)
    return tokens_BL.astype(jnp.int32), jnp.where(cmask_BT, logp_BT, 0.0).astype(jnp.float32)


def device_sequences(prompt_ids: Sequence[Sequence[int]], gen: Generation, group_size: int, pad_id: int,
                     prompt_buckets: Sequence[int] | None, lengths_N: np.ndarray
                     ) -> tuple[jax.Array, np.ndarray, np.ndarray, jax.Array]:
    """`sequences` with the token and log-prob arrays left on the devices, split like the sampler's rows
    (each host builds the prompt rows of its own devices: `hosts.host_to_global`); the masks, from the
    prompt lengths and the gathered completion lengths `lengths_N`, on the host."""
    prompt_PL, pmask_PL = pad_prompts(prompt_ids, prompt_buckets, pad_id)
    prompt_NW = np.repeat(prompt_PL, group_size, axis=0).astype(np.int32)
    cmask_NT = np.arange(gen.tokens.shape[1])[None, :] < lengths_N[:, None]
    mask = np.concatenate([np.repeat(pmask_PL, group_size, axis=0), cmask_NT], axis=1)
    prompt = hosts.host_to_global(prompt_NW, gen.tokens.sharding)
    tokens, old_logp = _join(prompt, gen.tokens, gen.logprobs, gen.lengths, pad_id=pad_id)
    return tokens, mask, cmask_NT, old_logp


def decode(tokenizer, tokens_BT: np.ndarray, lengths_B: np.ndarray) -> list[str]:
    """Completion texts, without the EOS token and padding."""
    eos = tokenizer.eos_token_id
    out = []
    for row, n in zip(tokens_BT, lengths_B):
        ids = [int(x) for x in row[: int(n)]]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        out.append(tokenizer.decode(ids, skip_special_tokens=True))
    return out


def collect(graphdef, params, records: list[dict[str, Any]], tokenizer, rewards, spec: SamplingSpec,
            seed) -> Rollout:
    """Samples, decodes and scores G completions for each record (`prompt_ids` from the data encoder).

    Args:
      rewards: the resolved rewards (`jaxrl.rewards.resolve`), built once per run.
    """
    prompt_ids = [r["prompt_ids"] for r in records]
    pad_id = int(tokenizer.pad_token_id)
    g = spec.num_samples
    t0 = time.perf_counter()
    gen = generate_from_state(graphdef, params, prompt_ids, spec, eos_ids=(int(tokenizer.eos_token_id),),
                              seed=seed, pad_id=pad_id)
    lengths = hosts.to_host(gen.lengths)  # per-row scalars: gathered
    finished = hosts.to_host(gen.finished)
    tokens, mask, cmask, old_logp = device_sequences(prompt_ids, gen, g, pad_id, spec.prompt_buckets, lengths)
    rep = [r for r in records for _ in range(g)]
    owners = hosts.row_owners(gen.tokens.sharding, tuple(gen.tokens.shape))
    mine = np.flatnonzero(owners == jax.process_index())  # the rows this host decodes and scores
    completions = [""] * len(rep)
    own_BT = hosts.fetch_held(gen.tokens)[mine]  # this host's devices only
    for i, text in zip(mine, decode(tokenizer, own_BT, lengths[mine])):
        completions[i] = text
    t1 = time.perf_counter()  # the sampler has finished: its lengths and tokens were read back
    rewards_NK, info = score_rows(rewards, [r["prompt"] for r in rep], completions, rep, lengths, owners)
    metrics = dict(info.metrics)
    # stage times of the step's breakdown (`jaxrl.rl.step` moves them out of the rollout's metrics)
    metrics.update({"time/generation": t1 - t0, "time/reward": time.perf_counter() - t1})
    metrics["response_length/mean"] = float(lengths.mean())
    metrics["response_length/max"] = float(lengths.max())
    metrics["response/finished_frac"] = float(finished.mean())
    return Rollout(tokens, mask, cmask, old_logp, rewards_NK, info.weights_K, info.names, rep, completions,
                   lengths, finished, metrics, (info,), pad_id=pad_id)


def concat(parts: Sequence[Rollout], pad_id: int) -> Rollout:
    """Concatenates rollouts (e.g. DAPO resampling rounds), left-padding prompts to the widest."""
    width = max(p.prompt_width for p in parts)

    def left(x, p, fill):
        return rows_lib.pad_columns(x, width - p.prompt_width, 0, fill)

    cat = lambda name: rows_lib.concat([getattr(p, name) for p in parts])
    return Rollout(
        rows_lib.concat([left(p.tokens_BL, p, pad_id) for p in parts]),
        rows_lib.concat([left(p.mask_BL, p, False) for p in parts]),
        cat("completion_mask_BT"), cat("old_logp_BT"), cat("rewards_NK"), parts[0].weights_K,
        parts[0].reward_names, [r for p in parts for r in p.records], [c for p in parts for c in p.completions],
        cat("lengths_N"), cat("finished_N"), dict(parts[0].metrics),
        tuple(i for p in parts for i in p.score_infos),
        None if parts[0].segment_N is None else cat("segment_N"), parts[0].segment_sizes, parts[0].pad_id,
    )


def select_groups(r: Rollout, groups: np.ndarray, group_size: int) -> Rollout:
    """The rows of the given group indices (DAPO dynamic sampling keeps non-degenerate groups)."""
    rows = (np.asarray(groups)[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
    return take_rows(r, rows)


def take_rows(r: Rollout, rows: np.ndarray) -> Rollout:
    """The given rows, in the given order (metrics and score infos kept as they are)."""
    rows = np.asarray(rows, np.int64)
    return dataclasses.replace(
        r, tokens_BL=rows_lib.take(r.tokens_BL, rows), mask_BL=r.mask_BL[rows],
        completion_mask_BT=r.completion_mask_BT[rows], old_logp_BT=rows_lib.take(r.old_logp_BT, rows), rewards_NK=r.rewards_NK[rows], records=[r.records[i] for i in rows],
        completions=[r.completions[i] for i in rows], lengths_N=r.lengths_N[rows],
        finished_N=r.finished_N[rows], segment_N=None if r.segment_N is None else r.segment_N[rows],
    )
