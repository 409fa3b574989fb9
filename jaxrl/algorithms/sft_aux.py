"""AFRL SFT-auxiliary rows (arXiv:2602.10006, [READING]): expert targets appended to the RL batch.

Each prompt of the step contributes one row (prompt + its reference target) laid out like a rollout row; the
train step trains these rows with the SFT NLL only (`sft_weight_B = 1`, weight `algorithm.params.lam`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl._checks import check as _check
from jaxrl.learner.train_step import TrainBatch


@dataclasses.dataclass(frozen=True)
class SFTAuxParams:
    """`algorithm.params` of sft_aux: weight λ_SFT (`lam`) of the expert-row NLL."""

    lam: float = 0.1

    def __post_init__(self):
        _check(self.lam >= 0, "algorithm.params.lam", self.lam, "must be >= 0")


def expert_rows(records, tokenizer, width: int, completion_width: int) -> TrainBatch:
    """Host-side expert rows [prompt left-padded to `width` | target (+EOS) cut to `completion_width`]."""
    pad = int(tokenizer.pad_token_id)
    n = len(records)
    tokens = np.full((n, width + completion_width), pad, np.int32)
    mask = np.zeros(tokens.shape, bool)
    cmask = np.zeros((n, completion_width), bool)
    for i, r in enumerate(records):
        p, t = r["prompt_ids"][-width:], r["target_ids"][:completion_width]
        tokens[i, width - len(p):width] = p
        tokens[i, width:width + len(t)] = t
        mask[i, width - len(p):width + len(t)] = True
        cmask[i, :len(t)] = True
    zeros = np.zeros(cmask.shape, np.float32)
    ones = np.ones((n,), np.float32)
    return TrainBatch(tokens, mask, cmask, zeros, zeros, zeros, ones * 0.2, ones * 0.2, ones)
