"""Bias attributes of a preference pair (DIR, arXiv:2512.23461): length, sycophancy, format.

Each attribute is a per-response score s(·); the pair attribute is the *relative* indicator
a = 1[s(chosen) > s(rejected)] (ties → 0, as in the DIR reference for length).

* length: token count (or characters when no tokenizer is given).
* sycophancy: 1 if the response opens with an agreeing phrase ("Yes, you are right.", "Great question", ...).
  Deviation: the DIR reference labels a pair 1 when it was *contaminated* with the prefix on either side; we
  label which side carries it, so the attribute is defined on any pair, including user data.
* format: number of markdown list items (lines starting with "-", "*", "+" or "1.") plus bold spans (**x**).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from jaxrl.errors import UserError

AGREEING_PREFIXES = (
    "yes, you are right", "you are right", "you're right", "you are absolutely right",
    "you're absolutely right",
    "great question", "what a great question", "excellent question", "absolutely right", "i agree with you",
)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S", re.MULTILINE)
_BOLD = re.compile(r"\*\*[^*\n]+?\*\*|__[^_\n]+?__")


def length_score(text: str, tokenizer=None) -> int:
    """Token count with `tokenizer` (no special tokens), else character count."""
    if tokenizer is None:
        return len(text)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def sycophancy_score(text: str) -> int:
    """1 when the response starts (after whitespace / quotes) with one of `AGREEING_PREFIXES`, else 0."""
    head = text.lstrip(" \t\n\"'").lower()
    return int(any(head.startswith(p) for p in AGREEING_PREFIXES))


def format_score(text: str) -> int:
    """Markdown list items + bold spans."""
    return len(_LIST_ITEM.findall(text)) + len(_BOLD.findall(text))


def response_scorer(attribute: str, tokenizer=None) -> Callable[[str], int]:
    """The per-response score function of `attribute` in {'length', 'sycophancy', 'format'}."""
    if attribute == "length":
        return lambda text: length_score(text, tokenizer)
    if attribute == "sycophancy":
        return sycophancy_score
    if attribute == "format":
        return format_score
    raise UserError(f"attribute {attribute!r}: allowed values are 'length', 'sycophancy', 'format'")


def pair_attribute(attribute: str, chosen: Sequence[str], rejected: Sequence[str],
                   tokenizer=None) -> np.ndarray:
    """a_B = 1[s(chosen_i) > s(rejected_i)] as int32 ``[B]``."""
    if len(chosen) != len(rejected):
        raise UserError(f"pair_attribute: {len(chosen)} chosen vs {len(rejected)} rejected responses")
    score = response_scorer(attribute, tokenizer)
    return np.asarray([int(score(c) > score(r)) for c, r in zip(chosen, rejected)], np.int32)
