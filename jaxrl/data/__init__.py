"""Prompt data: built-in generators, reasoning-gym, local files; splits, encoding, grain iterator."""

from jaxrl.data.pipeline import (
    Encoder,
    PromptLimit,
    check_prompt_lengths,
    eval_batches,
    make_splits,
    split_records,
    train_iterator,
)
from jaxrl.data.tasks import GENERATORS, arithmetic, countdown, load_records

__all__ = [
    "GENERATORS",
    "Encoder",
    "PromptLimit",
    "arithmetic",
    "check_prompt_lengths",
    "countdown",
    "eval_batches",
    "load_records",
    "make_splits",
    "split_records",
    "train_iterator",
]
