"""Host-side preparation for `generate`: input checks, shape buckets, left padding, and the `Generation` type.

Bucketing keeps the number of compiled shapes small in a training run: the prompt batch is left-padded to
the smallest prompt bucket that holds the longest prompt, and the decode buffer to the smallest generation
bucket that holds `max_new_tokens`. The number of prompts P and the group size G are not bucketed (a
training run keeps them fixed).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import numpy as np

from jaxrl.errors import UserError

# Powers of two: at most one compiled shape per doubling of the prompt / completion length.
DEFAULT_PROMPT_BUCKETS: tuple[int, ...] = tuple(2**i for i in range(4, 16))
DEFAULT_GEN_BUCKETS: tuple[int, ...] = tuple(2**i for i in range(4, 16))


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
    """How to sample: the one definition of the sampler's settings (`generate`, the trainer's rollouts).

    Attributes:
      max_new_tokens: completion length T >= 1 (rows stop earlier at an EOS token).
      num_samples: group size G >= 1 (samples per prompt).
      temperature: τ >= 0 (0 is greedy).
      top_k: keep the k most likely tokens (None: all).
      top_p: nucleus mass in (0, 1] (None: no nucleus filter).
      prompt_buckets, gen_buckets: allowed padded prompt widths / decode buffer widths (None: exact sizes).
      engine: "static" (every row keeps its row of the batch until the longest ends: `jaxrl.sampling.engine`)
        or "continuous" (`slots` decode slots, a finished row's slot refilled: `jaxrl.sampling.continuous`);
        the same tokens and log-probs for a seed.
      slots: the continuous engine's decode slots S, 1 <= S <= P·G (None: all P·G rows, no refill).
    """

    max_new_tokens: int
    num_samples: int = 1
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    prompt_buckets: tuple[int, ...] | None = DEFAULT_PROMPT_BUCKETS
    gen_buckets: tuple[int, ...] | None = DEFAULT_GEN_BUCKETS
    engine: str = "static"
    slots: int | None = None


class Generation(NamedTuple):
    """Sampled completions; row r = p * G + g is sample g of prompt p (rows of one prompt are contiguous).

    Attributes:
      tokens: [P*G, T] int32 completion tokens, `pad_id` after the end (T = max_new_tokens).
      lengths: [P*G] int32 number of completion tokens, counting the EOS token when there is one.
      logprobs: [P*G, T] float32 log π_τ(token | prefix) under the tempered, unfiltered distribution
        (log softmax(z/τ), τ = 1 when greedy; `filters.sampled_logprobs`), 0 after the end.
      finished: [P*G] bool, True when the row emitted an EOS token (False when it ran out of length).
      prompt_index: [P*G] int32 index p of the prompt the row continues.
      decode_steps: int32 scalar, the decode loop's iterations (each runs one forward of every row of a
        static batch, or of every slot of the continuous engine), or None.
    """

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array
    finished: jax.Array
    prompt_index: jax.Array
    decode_steps: jax.Array | None = None


class BucketError(UserError, ValueError):
    """An input longer than the largest shape bucket (a user-facing error: one line, exit 2 in the CLI)."""


def bucket(n: int, buckets: Sequence[int] | None, what: str) -> int:
    """Smallest bucket >= n (n itself when `buckets` is None); ValueError when n exceeds every bucket."""
    if buckets is None:
        return n
    fitting = [b for b in sorted(buckets) if b >= n]
    if not fitting:
        raise BucketError(
            f"{what} of {n} tokens exceeds the largest {what} bucket ({max(buckets)}), which bounds the KV "
            f"cache capacity; pass larger buckets or a shorter input"
        )
    return fitting[0]


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    """Validates a batch of token-id prompts and returns it as lists of Python ints."""
    if isinstance(prompts, (str, bytes)) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists; got an empty or string input")
    out = []
    for p, prompt in enumerate(prompts):
        ids = [int(t) for t in np.asarray(prompt).reshape(-1)] if len(prompt) else []
        if not ids:
            raise ValueError(f"prompt {p} is empty; every prompt needs at least one token")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {p} has token ids {bad[:5]} outside the vocabulary [0, {vocab_size})")
        out.append(ids)
    return out


def check_settings(
    *,
    max_new_tokens: int,
    num_samples: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    eos_ids: Sequence[int],
    pad_id: int,
    vocab_size: int,
) -> tuple[int, ...]:
    """Validates the sampling settings; returns `eos_ids` as a tuple of ints."""
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if int(num_samples) < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if not float(temperature) >= 0.0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k is not None and int(top_k) < 1:
        raise ValueError(f"top_k must be None or >= 1, got {top_k}")
    if top_p is not None and not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p}")
    eos = tuple(int(e) for e in eos_ids)
    bad = [e for e in eos if not 0 <= e < vocab_size]
    if bad:
        raise ValueError(f"eos_ids {bad} are outside the vocabulary [0, {vocab_size})")
    if not 0 <= int(pad_id) < vocab_size:
        raise ValueError(f"pad_id {pad_id} is outside the vocabulary [0, {vocab_size})")
    return eos


ENGINES = ("static", "continuous")


def check_engine(engine: str, slots: int | None, rows: int, shards: int = 1) -> int:
    """The number of decode slots to compile for: validates `engine` and `slots` against the P·G rows and the
    `shards` the rows are split over (at least 2 slots per shard, a multiple of them)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    if slots is None:
        return rows
    if engine == "static":
        raise ValueError(f"slots ({slots}) are the continuous engine's; the static engine decodes all {rows} rows")
    if not 2 <= int(slots) <= rows:  # one slot: a one-row decode step rounds unlike the static batch's
        raise ValueError(f"slots must be in [2, {rows}] (the rows of one call: prompts x samples), got {slots}")
    if int(slots) % shards or int(slots) < 2 * shards:
        raise ValueError(f"slots ({slots}) must be a multiple of the {shards} row shards, at least 2 per shard")
    return int(slots)


def check_budgets(budgets, rows: int, max_new_tokens: int) -> np.ndarray:
    """[rows] int32 per-row length budgets (None: max_new_tokens for every row); each in [1, max_new_tokens]."""
    if budgets is None:
        return np.full((rows,), int(max_new_tokens), np.int32)
    out = np.asarray(budgets, np.int64).reshape(-1)
    if out.shape != (rows,) or out.min() < 1 or out.max() > int(max_new_tokens):
        raise ValueError(f"max_new_per_row must hold {rows} budgets in [1, {max_new_tokens}], got shape "
                         f"{out.shape} in [{out.min()}, {out.max()}]")
    return out.astype(np.int32)


def left_pad(prompts: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads prompts to `width`: returns tokens_PL int32 and mask_PL bool (True = real token)."""
    tokens_PL = np.full((len(prompts), width), pad_id, dtype=np.int32)
    mask_PL = np.zeros((len(prompts), width), dtype=bool)
    for p, ids in enumerate(prompts):
        if len(ids) > width:
            raise ValueError(f"prompt {p} has {len(ids)} tokens, more than the padded width {width}")
        tokens_PL[p, width - len(ids):] = ids
        mask_PL[p, width - len(ids):] = True
    return tokens_PL, mask_PL


def pad_prompts(prompts: Sequence[Sequence[int]], buckets: Sequence[int] | None, pad_id: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads prompts to the smallest bucket that holds the longest (its exact length when `buckets` is
    None): tokens_PL int32 and mask_PL bool. The one bucketing + padding helper of jaxrl."""
    width = bucket(max(len(p) for p in prompts), buckets, "prompt")
    return left_pad(prompts, width, pad_id)
