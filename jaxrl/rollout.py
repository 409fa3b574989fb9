"""From a batch of prompts to a scored, padded batch of full sequences (prompt + completion).

`collect(...)` samples G completions per prompt with `jaxrl.sampling`, decodes and scores them with the
configured rewards, and lays the result out as `[B, L]` arrays (L = prompt bucket + completion width) for the
train step:

    tokens_BL   = [left-padded prompt | completion, padded after EOS]
    mask_BL     = real tokens;  loss_mask_BL = completion tokens (incl. EOS)
    old_logp_BL = the sampler's log-probs at completion positions (0 elsewhere)

Everything here is host-side glue around jitted functions (sampler, log-prob pass); nothing is traced.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxrl import rewards as rewards_lib
from jaxrl.data.pipeline import pad_left
from jaxrl.sampling import Generation, generate_from_state


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
    group_size: int
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    prompt_buckets: tuple[int, ...] = ()
    gen_buckets: tuple[int, ...] = ()


@dataclasses.dataclass
class Rollout:
    """One rollout batch of N = P * G samples (rows of a prompt contiguous)."""

    tokens_BL: np.ndarray
    mask_BL: np.ndarray
    loss_mask_BL: np.ndarray
    old_logp_BL: np.ndarray
    prompt_width: int
    rewards_NK: np.ndarray
    weights_K: np.ndarray
    reward_names: tuple[str, ...]
    records: list[dict[str, Any]]  # the prompt's record, repeated G times
    completions: list[str]
    lengths_N: np.ndarray
    finished_N: np.ndarray
    metrics: dict[str, float]

    @property
    def completion_mask_NT(self) -> np.ndarray:
        return self.loss_mask_BL[:, self.prompt_width:]


def sequences(prompt_ids: Sequence[Sequence[int]], gen: Generation, group_size: int, pad_id: int,
              prompt_buckets: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Full-sequence arrays of a generation: (tokens_BL, mask_BL, loss_mask_BL, old_logp_BL, prompt_width)."""
    prompt_PL, pmask_PL = pad_left(prompt_ids, prompt_buckets, pad_id)
    prompt_BL = np.repeat(prompt_PL, group_size, axis=0)
    pmask_BL = np.repeat(pmask_PL, group_size, axis=0)
    tokens_BT = np.asarray(gen.tokens)
    t = tokens_BT.shape[1]
    cmask_BT = np.arange(t)[None, :] < np.asarray(gen.lengths)[:, None]
    tokens = np.concatenate([prompt_BL, np.where(cmask_BT, tokens_BT, pad_id)], axis=1).astype(np.int32)
    mask = np.concatenate([pmask_BL, cmask_BT], axis=1)
    loss_mask = np.concatenate([np.zeros_like(pmask_BL), cmask_BT], axis=1)
    old_logp = np.concatenate([np.zeros(prompt_BL.shape, np.float32),
                               np.where(cmask_BT, np.asarray(gen.logprobs), 0.0)], axis=1).astype(np.float32)
    return tokens, mask, loss_mask, old_logp, prompt_PL.shape[1]


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


def collect(graphdef, params, records: list[dict[str, Any]], tokenizer, reward_specs, spec: SamplingSpec,
            seed) -> Rollout:
    """Samples, decodes and scores G completions for each record (`prompt_ids` from the data encoder)."""
    prompt_ids = [r["prompt_ids"] for r in records]
    pad_id = int(tokenizer.pad_token_id)
    gen = generate_from_state(
        graphdef, params, prompt_ids, max_new_tokens=spec.max_new_tokens, num_samples=spec.group_size,
        temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p,
        eos_ids=(int(tokenizer.eos_token_id),), seed=seed, pad_id=pad_id,
        prompt_buckets=spec.prompt_buckets or None, gen_buckets=spec.gen_buckets or None,
    )
    tokens, mask, loss_mask, old_logp, width = sequences(prompt_ids, gen, spec.group_size, pad_id,
                                                         spec.prompt_buckets)
    lengths = np.asarray(gen.lengths)
    completions = decode(tokenizer, np.asarray(gen.tokens), lengths)
    rep = [r for r in records for _ in range(spec.group_size)]
    internal = ("prompt", "prompt_ids", "sft_target", "target_ids")  # encoder outputs, not dataset fields
    fields = {k: [r[k] for r in rep] for k in records[0] if k not in internal}
    fields["completion_length"] = [int(n) for n in lengths]
    rewards_NK, info = rewards_lib.score(reward_specs, [r["prompt"] for r in rep], completions, fields)
    metrics = dict(info.metrics)
    metrics["response_length/mean"] = float(lengths.mean())
    metrics["response_length/max"] = float(lengths.max())
    metrics["response/finished_frac"] = float(np.asarray(gen.finished).mean())
    return Rollout(tokens, mask, loss_mask, old_logp, width, rewards_NK, info.weights_K, info.names, rep,
                   completions, lengths, np.asarray(gen.finished), metrics)


def concat(parts: Sequence[Rollout], group_size: int, pad_id: int, max_groups: int | None = None) -> Rollout:
    """Concatenates rollouts (e.g. DAPO resampling rounds), padding prompt widths to the widest; keeps at most
    `max_groups` groups."""
    width = max(p.prompt_width for p in parts)

    def left(x, p, fill):
        pad = width - p.prompt_width
        return np.pad(x, ((0, 0), (pad, 0)), constant_values=fill) if pad else x

    cat = lambda name, fill: np.concatenate([left(getattr(p, name), p, fill) for p in parts], axis=0)
    out = Rollout(
        cat("tokens_BL", pad_id), cat("mask_BL", False), cat("loss_mask_BL", False), cat("old_logp_BL", 0.0),
        width,
        np.concatenate([p.rewards_NK for p in parts]), parts[0].weights_K, parts[0].reward_names,
        [r for p in parts for r in p.records], [c for p in parts for c in p.completions],
        np.concatenate([p.lengths_N for p in parts]), np.concatenate([p.finished_N for p in parts]),
        dict(parts[0].metrics),
    )
    if max_groups is not None:
        out = select_groups(out, np.arange(min(max_groups, out.tokens_BL.shape[0] // group_size)), group_size)
    return out


def select_groups(r: Rollout, groups: np.ndarray, group_size: int) -> Rollout:
    """The rows of the given group indices (DAPO dynamic sampling keeps non-degenerate groups)."""
    rows = (np.asarray(groups)[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
    return dataclasses.replace(
        r, tokens_BL=r.tokens_BL[rows], mask_BL=r.mask_BL[rows], loss_mask_BL=r.loss_mask_BL[rows],
        old_logp_BL=r.old_logp_BL[rows], rewards_NK=r.rewards_NK[rows], records=[r.records[i] for i in rows],
        completions=[r.completions[i] for i in rows], lengths_N=r.lengths_N[rows],
        finished_N=r.finished_N[rows],
    )
