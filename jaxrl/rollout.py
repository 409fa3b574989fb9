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
and the reward matrix, lengths and error counts are then gathered, so every host holds the same `Rollout`
(token arrays complete, `completions` text only for its own rows, "" elsewhere) and takes the same decisions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from jaxrl import rewards as rewards_lib
from jaxrl.sampling import Generation, SamplingSpec, generate_from_state, pad_prompts
from jaxrl.sharding import hosts


@dataclasses.dataclass
class Rollout:
    """One rollout batch of N = P * G samples (rows of a prompt contiguous)."""

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


_INTERNAL = ("prompt", "prompt_ids", "sft_target", "target_ids")  # encoder outputs, not dataset fields


def collect(graphdef, params, records: list[dict[str, Any]], tokenizer, rewards, spec: SamplingSpec,
            seed) -> Rollout:
    """Samples, decodes and scores G completions for each record (`prompt_ids` from the data encoder).

    Args:
      rewards: the resolved rewards (`jaxrl.rewards.resolve`), built once per run.
    """
    prompt_ids = [r["prompt_ids"] for r in records]
    pad_id = int(tokenizer.pad_token_id)
    g = spec.num_samples
    gen = generate_from_state(graphdef, params, prompt_ids, spec, eos_ids=(int(tokenizer.eos_token_id),),
                              seed=seed, pad_id=pad_id)
    tokens, mask, cmask, old_logp = sequences(prompt_ids, gen, g, pad_id, spec.prompt_buckets)
    lengths = hosts.to_host(gen.lengths)
    finished = hosts.to_host(gen.finished)
    rep = [r for r in records for _ in range(g)]
    owners = hosts.row_owners(gen.tokens.sharding, tuple(gen.tokens.shape))
    mine = np.flatnonzero(owners == jax.process_index())  # the rows this host decodes and scores
    completions = [""] * len(rep)
    for i, text in zip(mine, decode(tokenizer, tokens[mine, -cmask.shape[1]:], lengths[mine])):
        completions[i] = text
    fields = {k: [rep[i][k] for i in mine] for k in records[0] if k not in _INTERNAL}
    fields["completion_length"] = [int(lengths[i]) for i in mine]
    own_NK, info = rewards_lib.score(rewards, [rep[i]["prompt"] for i in mine],
                                     [completions[i] for i in mine], fields)
    rewards_NK = np.zeros((len(rep), own_NK.shape[1]), np.float32)
    rewards_NK[mine] = own_NK
    rewards_NK = hosts.gather_owned(rewards_NK, owners)
    info = _global_info(info, rewards_NK)
    metrics = dict(info.metrics)
    metrics["response_length/mean"] = float(lengths.mean())
    metrics["response_length/max"] = float(lengths.max())
    metrics["response/finished_frac"] = float(finished.mean())
    return Rollout(tokens, mask, cmask, old_logp, rewards_NK, info.weights_K, info.names, rep, completions,
                   lengths, finished, metrics, (info,))


def _global_info(info: rewards_lib.ScoreInfo, rewards_NK: np.ndarray) -> rewards_lib.ScoreInfo:
    """A host's `ScoreInfo` of its own rows made global: failure counts summed over hosts, per-reward means
    recomputed from the gathered matrix (the same on every host). Single-process: the same values."""
    counts = hosts.sum_across_hosts(np.asarray([info.errors.get(name, 0) for name in info.names], np.int64))
    errors = {name: int(c) for name, c in zip(info.names, counts)}
    metrics = {}
    for k, name in enumerate(info.names):
        finite = rewards_NK[:, k][~np.isnan(rewards_NK[:, k])]
        metrics[f"reward/{name}/mean"] = float(finite.mean()) if finite.size else float("nan")
        metrics[f"reward/{name}/errors"] = float(errors[name])
    return info._replace(errors=errors, metrics=metrics, num_samples=int(rewards_NK.shape[0]))


def concat(parts: Sequence[Rollout], pad_id: int) -> Rollout:
    """Concatenates rollouts (e.g. DAPO resampling rounds), left-padding prompts to the widest."""
    width = max(p.prompt_width for p in parts)

    def left(x, p, fill):
        pad = width - p.prompt_width
        return np.pad(x, ((0, 0), (pad, 0)), constant_values=fill) if pad else x

    cat = lambda name: np.concatenate([getattr(p, name) for p in parts], axis=0)
    return Rollout(
        np.concatenate([left(p.tokens_BL, p, pad_id) for p in parts]),
        np.concatenate([left(p.mask_BL, p, False) for p in parts]),
        cat("completion_mask_BT"), cat("old_logp_BT"), cat("rewards_NK"), parts[0].weights_K,
        parts[0].reward_names, [r for p in parts for r in p.records], [c for p in parts for c in p.completions],
        cat("lengths_N"), cat("finished_N"), dict(parts[0].metrics),
        tuple(i for p in parts for i in p.score_infos),
        None if parts[0].segment_N is None else cat("segment_N"), parts[0].segment_sizes,
    )


def select_groups(r: Rollout, groups: np.ndarray, group_size: int) -> Rollout:
    """The rows of the given group indices (DAPO dynamic sampling keeps non-degenerate groups)."""
    rows = (np.asarray(groups)[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
    return take_rows(r, rows)


def take_rows(r: Rollout, rows: np.ndarray) -> Rollout:
    """The given rows, in the given order (metrics and score infos kept as they are)."""
    rows = np.asarray(rows, np.int64)
    return dataclasses.replace(
        r, tokens_BL=r.tokens_BL[rows], mask_BL=r.mask_BL[rows], completion_mask_BT=r.completion_mask_BT[rows],
        old_logp_BT=r.old_logp_BT[rows], rewards_NK=r.rewards_NK[rows], records=[r.records[i] for i in rows],
        completions=[r.completions[i] for i in rows], lengths_N=r.lengths_N[rows],
        finished_N=r.finished_N[rows], segment_N=None if r.segment_N is None else r.segment_N[rows],
    )
