"""Train/eval splits, prompt encoding with the tokenizer's chat template, and the resumable grain iterator.

The train iterator is `MapDataset.source(records).shuffle(seed).repeat().batch(n)`, each host encoding its
block of every batch: in-process (no worker processes), reshuffled every epoch, and its position is a small JSON-able dict
(`get_state()` / `set_state()`) stored in checkpoints so a resumed run sees exactly the same batches.
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from typing import Any, Iterator, Sequence

import grain
import numpy as np

from jaxrl.data.tasks import load_records
from jaxrl.errors import ConfigError

log = logging.getLogger(__name__)
LONG_PROMPT_CHOICES = ("error", "drop")


def split_records(
    records: Sequence[dict[str, Any]], eval_size: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval): duplicates (same prompt) dropped, order permuted by `seed`, the first `eval_size` held
    out.

    Deduplicating before the split keeps the eval prompts out of the training set even for small generators.
    """
    seen: dict[str, dict[str, Any]] = {}
    for rec in records:
        seen.setdefault(rec["prompt"], rec)
    unique = list(seen.values())
    order = np.random.default_rng(seed).permutation(len(unique))
    shuffled = [unique[i] for i in order]
    if len(shuffled) <= eval_size:
        raise ConfigError(
            f"data.eval_size={eval_size}: only {len(shuffled)} distinct prompts, none left to train on"
        )
    return shuffled[eval_size:], shuffled[:eval_size]


@dataclasses.dataclass(frozen=True)
class PromptLimit:
    """The most prompt tokens (chat template included) a rollout can take, and why: `tokens` =
    min(context − max_new_tokens, largest prompt bucket). `on_long`: "error" (`data.on_long_prompt`) refuses a
    longer prompt, "drop" leaves its record out (the count is logged)."""

    tokens: int
    why: str
    on_long: str = "error"

    @classmethod
    def of(cls, *, context: int, max_new_tokens: int, prompt_buckets: Sequence[int] = (),
           on_long: str = "error") -> "PromptLimit":
        limit = cls(context - max_new_tokens, f"the model's context of {context} tokens less "
                                              f"rollout.max_new_tokens={max_new_tokens}", on_long)
        if prompt_buckets and max(prompt_buckets) < limit.tokens:
            limit = cls(max(prompt_buckets), "the largest rollout.prompt_buckets", on_long)
        return limit


def check_prompt_lengths(records: Sequence[dict[str, Any]], encoder: "Encoder",
                         limit: PromptLimit) -> list[dict[str, Any]]:
    """The records whose encoded prompt fits `limit`; a longer one raises ConfigError naming the record index
    and both lengths (`on_long="error"`) or is dropped with a logged count (`"drop"`)."""
    if limit.on_long not in LONG_PROMPT_CHOICES:
        raise ConfigError(f"data.on_long_prompt={limit.on_long!r}: allowed values are "
                          f"{', '.join(map(repr, LONG_PROMPT_CHOICES))}")
    kept, dropped, lengths = [], 0, {}
    for i, rec in enumerate(records):
        n = lengths.get(rec["prompt"])
        if n is None:  # each distinct prompt is encoded once (generators repeat theirs)
            n = lengths[rec["prompt"]] = len(encoder.prompt_ids(rec["prompt"]))
        if n <= limit.tokens:
            kept.append(rec)
        elif limit.on_long == "drop":
            dropped += 1
        else:
            raise ConfigError(f"data: record {i}'s prompt is {n} tokens (chat template included), longer "
                              f"than {limit.tokens} ({limit.why}); shorten it, or set data.on_long_prompt=drop "
                              "to leave such records out")
    if dropped:
        log.warning("data: dropped %d of %d records whose prompt is longer than %d tokens (%s; "
                    "data.on_long_prompt=drop)", dropped, len(records), limit.tokens, limit.why)
    if not kept and records:
        raise ConfigError(f"data: every one of the {len(records)} records has a prompt longer than "
                          f"{limit.tokens} tokens ({limit.why})")
    return kept


def make_splits(
    source: str,
    *,
    train_size: int,
    eval_size: int,
    seed: int,
    params: dict[str, Any] | None = None,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    encoder: "Encoder | None" = None,
    prompt_limit: PromptLimit | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Loads `train_size + eval_size` records of a source (all rows of a file) and splits them.

    With `encoder` and `prompt_limit`, records whose encoded prompt is longer than the limit are refused or
    dropped before the split (`check_prompt_lengths`), so the held-out set keeps its size."""
    records = load_records(
        source,
        train_size + eval_size,
        seed,
        params=params,
        prompt_field=prompt_field,
        answer_field=answer_field,
    )
    if encoder is not None and prompt_limit is not None:
        records = check_prompt_lengths(records, encoder, prompt_limit)
    return split_records(records, eval_size, seed)


@dataclasses.dataclass(frozen=True)
class Encoder:
    """Adds `prompt_ids` (chat template + generation prompt), `sft_target`, `target_ids` (+eos) to a record.

    The SFT text goes under `sft_target`, never `target`: countdown records carry their numeric `target`.
    With `target_formats`, a record's target style is `target_formats[crc32(f"{variant}:{prompt}") % n]`: a
    deterministic function of the prompt and of `variant` (the SFT warm start passes its step, so each prompt
    is shown in every style over the run and replayed warm starts see the same targets)."""

    tokenizer: Any
    system_prompt: str | None = None
    target_format: str = "<answer>{answer}</answer>"
    target_formats: tuple[str, ...] = ()

    def prompt_ids(self, prompt: str) -> list[int]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": prompt})
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def target(self, answer: str, prompt: str = "", variant: int = 0) -> str:
        fmt = self.target_format
        if self.target_formats:
            key = f"{variant}:{prompt}".encode("utf-8")
            fmt = self.target_formats[zlib.crc32(key) % len(self.target_formats)]
        # str.replace, not str.format: LaTeX answers contain braces.
        return fmt.replace("{answer}", answer)

    def __call__(self, record: dict[str, Any], variant: int = 0) -> dict[str, Any]:
        target = self.target(record["answer"], record["prompt"], variant)
        target_ids = list(self.tokenizer.encode(target, add_special_tokens=False)) + [
            self.tokenizer.eos_token_id
        ]
        return {
            **record,
            "prompt_ids": self.prompt_ids(record["prompt"]),
            "sft_target": target,
            "target_ids": target_ids,
        }


def _as_list(batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(batch)


def train_iterator(
    records: Sequence[dict[str, Any]],
    encoder: Encoder,
    *,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[list[dict[str, Any]]]:
    """Endless iterator of this host's batches (lists of encoded records) with `get_state`/`set_state`.

    Every host walks the same global order (the records shuffled by `seed`, reshuffled each epoch) in global
    batches of `batch_size`; host p reads and encodes only its block of each batch, records
    [p·b, (p+1)·b) with b = batch_size / process_count. So the hosts' blocks, concatenated in process order,
    are exactly the batch one process would read, and the position (`get_state`) is the same on every host.

    Args:
      records: the training records (all hosts pass the same list).
      batch_size: the global number of prompts per step.
      process_index, process_count: this host's block of every batch.
    """
    if batch_size % process_count:
        raise ConfigError(
            f"data.prompts_per_step={batch_size} is not divisible by the {process_count} processes"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must be in [0, {process_count})")
    per_host = batch_size // process_count
    lo = process_index * per_host
    ds = grain.MapDataset.source(list(records)).shuffle(seed=seed).repeat()
    # grain's `batch` takes `len` of the endless dataset, which overflows for a batch of 1 (sys.maxsize + 1
    # elements); a batch of one record is the same list.
    ds = ds.batch(batch_size, batch_fn=_as_list) if batch_size > 1 else ds.map(lambda r: [r])
    ds = ds.map(lambda batch: [encoder(r) for r in batch[lo:lo + per_host]])
    return iter(ds.to_iter_dataset())


def eval_batches(
    records: Sequence[dict[str, Any]], encoder: Encoder, batch_size: int
) -> list[list[dict[str, Any]]]:
    """The held-out records, encoded, in fixed order, in batches of at most `batch_size`."""
    encoded = [encoder(r) for r in records]
    return [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
