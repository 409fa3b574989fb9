"""Pairwise preference data: (prompt, chosen, rejected) from .jsonl / .parquet, or the built-in task.

Synthetic task (`synthetic_pairs`): "a+b=" questions; the chosen response holds the correct sum, the rejected
one a wrong sum (off by 1 or 2). One response of each pair is *decorated* with the planted bias (`bias`):
  length      "well, I think that it is 7" instead of "7"
  sycophancy  "Yes, you are right. 7"
  format      "- **7**"
and the decorated response is the chosen one with probability `chosen_decorated_rate` (0.8 for training: the
shortcut agrees with the label on 80% of pairs; 0.5 for a balanced evaluation set).

Encoding: token ids of `prompt + " " + response` followed by EOS, right-padded with the pad id to `max_len`
(the reward head reads the last non-pad token, HF's rule, so the EOS token is the one scored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from jaxrl.errors import UserError
from jaxrl.reward_model.attributes import pair_attribute

BIASES = {
    "length": "well, I think that it is {answer}",
    "sycophancy": "Yes, you are right. {answer}",
    "format": "- **{answer}**",
}


def synthetic_pairs(n: int, seed: int, *, chosen_decorated_rate: float, bias: str = "length",
                    max_operand: int = 9) -> list[dict[str, Any]]:
    """n arithmetic preference pairs with a planted bias (see the module docstring)."""
    if bias not in BIASES:
        raise UserError(f"synthetic data bias={bias!r}: allowed values are {', '.join(map(repr, BIASES))}")
    if max_operand < 1:
        raise UserError(f"synthetic data max_operand={max_operand}: must be >= 1")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a, b = (int(x) for x in rng.integers(0, max_operand + 1, size=2))
        good = a + b
        deltas = [d for d in (-2, -1, 1, 2) if good + d >= 0]
        bad = good + int(rng.choice(deltas))
        decorate_chosen = bool(rng.random() < chosen_decorated_rate)
        decorated = BIASES[bias]
        chosen = decorated.format(answer=good) if decorate_chosen else str(good)
        rejected = str(bad) if decorate_chosen else decorated.format(answer=bad)
        out.append({"prompt": f"{a}+{b}=", "chosen": chosen, "rejected": rejected})
    return out


def load_pairs(path: str | Path, *, prompt_field: str = "prompt", chosen_field: str = "chosen",
               rejected_field: str = "rejected") -> list[dict[str, Any]]:
    """Rows {prompt, chosen, rejected} of a .jsonl or .parquet file (string fields required)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"preference data file not found: {path}")
    if path.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}:{i}: invalid JSON ({e.msg})") from None
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        raise UserError(f"{path}: preference data must be .jsonl or .parquet")
    fields = {"prompt": prompt_field, "chosen": chosen_field, "rejected": rejected_field}
    out = []
    for i, row in enumerate(rows):
        rec = {}
        for ours, theirs in fields.items():
            value = row.get(theirs) if isinstance(row, dict) else None
            if not isinstance(value, str):
                raise UserError(f"{path}: row {i} has no string field {theirs!r} (needed as {ours}); "
                                f"fields: {sorted(row) if isinstance(row, dict) else type(row).__name__}")
            rec[ours] = value
        out.append(rec)
    if not out:
        raise UserError(f"{path}: no preference pairs")
    return out


def encode_text(tokenizer, prompt: str, response: str) -> list[int]:
    """Token ids of `prompt + " " + response` + EOS (no other special tokens)."""
    ids = tokenizer(prompt + " " + response, add_special_tokens=False)["input_ids"]
    return list(ids) + [tokenizer.eos_token_id]


def pad_right(seqs: Sequence[Sequence[int]], length: int, pad_id: int) -> np.ndarray:
    """[B, length] int32, each row left-aligned and filled with `pad_id`."""
    out = np.full((len(seqs), length), pad_id, np.int32)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out


class PairArrays(NamedTuple):
    chosen_BL: np.ndarray        # int32, right padded
    rejected_BL: np.ndarray      # int32, right padded
    attributes: dict[str, np.ndarray]   # name -> int32 [B], a = 1[s(chosen) > s(rejected)]
    records: list[dict[str, Any]]
    dropped: int                 # pairs longer than max_len


def encode_pairs(records: Sequence[dict[str, Any]], tokenizer, max_len: int) -> PairArrays:
    """Tokenises pairs, drops those longer than `max_len`, computes all three pair attributes (length in
    tokens)."""
    kept, chosen, rejected = [], [], []
    for rec in records:
        c = encode_text(tokenizer, rec["prompt"], rec["chosen"])
        r = encode_text(tokenizer, rec["prompt"], rec["rejected"])
        if max(len(c), len(r)) <= max_len:
            kept.append(rec)
            chosen.append(c)
            rejected.append(r)
    if not kept:
        raise UserError(f"no preference pair fits data.max_len={max_len} tokens")
    attrs = {name: pair_attribute(name, [r["chosen"] for r in kept], [r["rejected"] for r in kept],
                                  tokenizer if name == "length" else None)
             for name in ("length", "sycophancy", "format")}
    return PairArrays(pad_right(chosen, max_len, tokenizer.pad_token_id),
                      pad_right(rejected, max_len, tokenizer.pad_token_id), attrs, list(kept),
                      len(records) - len(kept))


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> np.ndarray:
    """Indices of training batch `step`: a fresh permutation of [0, n) per epoch (stateless, so resume is
    exact)."""
    flat = np.arange(step * batch_size, (step + 1) * batch_size)
    epochs, pos = flat // n, flat % n
    out = np.empty(batch_size, np.int64)
    for e in np.unique(epochs):
        perm = np.random.default_rng([seed, int(e)]).permutation(n)
        out[epochs == e] = perm[pos[epochs == e]]
    return out
