"""Training rows from the sampler's output, and rollouts moved by whole rows (`jaxrl.types.Rollout`, whose
docstring has the row layout and dimension letters).

  sequences / device_sequences   a generation as [prompt | completion] rows with masks and old log-probs
  decode                         completion texts, without EOS and padding
  concat / select_groups / take_rows   whole rows joined or picked (DAPO's resampling rounds, mini-batches)

Multi-host (tpu/README.md, "How a step is split across hosts"): the sampled tokens and their log-probs never
leave the devices: `device_sequences` returns them as global `jax.Array`s split over the batch axis like the
sampler's output, and the row movers act on the devices (`jaxrl.sharding.rows`). The masks, derived from the
prompt lengths and the gathered completion lengths, are host arrays, the same on every host.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.sampling.batching import Generation, pad_prompts
from jaxrl.sharding import hosts, rows as rows_lib
from jaxrl.types import Rollout


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
                     prompt_buckets: Sequence[int] | None, lengths_B: np.ndarray
                     ) -> tuple[jax.Array, np.ndarray, np.ndarray, jax.Array]:
    """`sequences` with the token and log-prob arrays left on the devices, split like the sampler's rows
    (each host builds the prompt rows of its own devices: `hosts.host_to_global`); the masks, from the
    prompt lengths and the gathered completion lengths `lengths_B`, on the host."""
    prompt_PL, pmask_PL = pad_prompts(prompt_ids, prompt_buckets, pad_id)
    prompt_BW = np.repeat(prompt_PL, group_size, axis=0).astype(np.int32)
    cmask_BT = np.arange(gen.tokens.shape[1])[None, :] < lengths_B[:, None]
    mask = np.concatenate([np.repeat(pmask_PL, group_size, axis=0), cmask_BT], axis=1)
    prompt = hosts.host_to_global(prompt_BW, gen.tokens.sharding)
    tokens, old_logp = _join(prompt, gen.tokens, gen.logprobs, gen.lengths, pad_id=pad_id)
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


def concat(parts: Sequence[Rollout], pad_id: int) -> Rollout:
    """Concatenates rollouts (e.g. DAPO resampling rounds), left-padding prompts to the widest."""
    width = max(p.prompt_width for p in parts)

    def left(x, p, fill):
        return rows_lib.pad_columns(x, width - p.prompt_width, 0, fill)

    cat = lambda name: rows_lib.concat([getattr(p, name) for p in parts])
    return Rollout(
        tokens_BL=rows_lib.concat([left(p.tokens_BL, p, pad_id) for p in parts]),
        mask_BL=rows_lib.concat([left(p.mask_BL, p, False) for p in parts]),
        completion_mask_BT=cat("completion_mask_BT"), old_logp_BT=cat("old_logp_BT"), lengths_B=cat("lengths_B"),
        finished_B=cat("finished_B"), completions=[c for p in parts for c in p.completions], role=parts[0].role,
        records=[r for p in parts for r in p.records], rewards_BR=cat("rewards_BR"), weights_R=parts[0].weights_R,
        reward_names=parts[0].reward_names, metrics=dict(parts[0].metrics),
        score_infos=tuple(i for p in parts for i in p.score_infos),
        segment_B=None if parts[0].segment_B is None else cat("segment_B"), segment_sizes=parts[0].segment_sizes,
        pad_id=parts[0].pad_id)


def select_groups(r: Rollout, groups: np.ndarray, group_size: int) -> Rollout:
    """The rows of the given group indices (DAPO dynamic sampling keeps non-degenerate groups)."""
    rows = (np.asarray(groups)[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
    return take_rows(r, rows)


def take_rows(r: Rollout, rows: np.ndarray) -> Rollout:
    """The given rows, in order, device rows moved on the devices (metrics and score infos kept as they are)."""
    return r.take(rows, rows_lib.take)
