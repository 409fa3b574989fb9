"""The unpadded layout of an RL batch, and the work each layout of the update's forward costs.

`train.packing: auto` picks, per mini-batch, the forward that computes least (`jaxrl.rl.packing.rl_plan`):

* padded rows: B·L positions (P·W + B·T with shared prompts, G > 1);
* packed rows (`packing.rl_layout`): R·L positions, several rows' real tokens per row of width L; rows
  longer than L/2 cannot share one, so uniform completion lengths pack nothing;
* unpadded rows (`unpadded_layout`, `jaxrl.models.unpadded`): one row per block holding its rows' real
  tokens end to end, N per block, attention run on rows of each sequence in C classes by length (`CLASSES`).

Attention is what tells them apart: causal attention over rows of width L reads ~L²/2 (query, key) pairs per
row: B rows padded, R rows packed, and for unpadded rows Σ_c B_c·L_c²/2, each class as wide as its longest. `work` weighs a pair `attention_weight` times a position's
dense work (`attention_weight_of`: its FLOPs ratio for the model, doubled because XLA:CPU's blocked attention
ran at about half the throughput of its matmuls in the update's profile, benchmarks/RESULTS.md), so rows of
a long-tailed batch (most of them short) pack, and uniform ones unpad.

Static shapes: N takes one of `WIDTH_STEPS` sizes (sixteenths of the padded block, B/R·L), each class width
one of sixteenths of L, and the number of completion predictions per block, M, one of `RL_LADDER` (eighths
of B/R·T): a bounded set of programs per batch size, a handful in practice (the lengths of a run's batches
move slowly), each compiled the first time it is met.
"""

from __future__ import annotations

import dataclasses

import numpy as np

RL_LADDER = 8  # packed rows per block take one of 8 sizes (eighths of the block): at most 8 programs per width
WIDTH_STEPS = 16  # unpadded rows take one of 16 widths (sixteenths of the block's padded positions)
CLASSES = (4, 2, 1)  # attention classes of a block's rows, the most dividing its rows (`classes_of`)
# Classes only where the padded rows' attention is more than this share of the update's work (`work`): each
# class adds a copy of the attention program, and the tiny update of 16 rows of 64 + 128 tokens (attention ~11%
# of its work) peaked at 1027 MiB with four classes, 742 with one, for 4% less work.
CLASS_SHARE = 0.15
ATTENTION_WEIGHT = 1e-3  # `attention_weight_of` a 0.1-1B model, where the caller has no model at hand


def ladder(per_block: int, steps: int = RL_LADDER) -> list[int]:
    """The sizes a block's count may take: ⌈per_block·i/steps⌉ for i = 1..steps, distinct, ascending."""
    return sorted({-(-per_block * i // steps) for i in range(1, steps + 1)})


def attention_weight_of(cfg) -> float:
    """A (query, key) pair's attention FLOPs over one position's dense FLOPs (q/k/v/o projections and the
    SwiGLU MLP of a layer), doubled (module docstring): 2·4·N·H / 2·(D·(N + 2K)·H + N·H·D + 3·D·F)."""
    d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    return 2 * 4 * n * h / (2 * (d * (n + 2 * k) * h + n * h * d + 3 * d * f))


def work(positions: int, rows: int, length: int, attention_weight: float) -> float:
    """Dense positions plus `attention_weight` x the causal pairs of `rows` rows of width `length`."""
    return positions + attention_weight * rows * length * (length + 1) / 2


def classes_of(per_block: int, length: int, attention_weight: float) -> int:
    """Attention classes of a block of `per_block` rows of width `length`: the most of CLASSES dividing it
    where attention is more than CLASS_SHARE of a padded row's `work`, else one."""
    row = work(length, 1, length, attention_weight)
    if (row - length) / row <= CLASS_SHARE:
        return 1
    return next(c for c in CLASSES if per_block % c == 0)


@dataclasses.dataclass(frozen=True)
class UnpaddedLayout:
    """Where a batch's real tokens go (block-local indices, one unpadded row per block; −1: padding).

    `src_RN` each position's padded slot (row-in-block·L + column), `segment_RN` its row's segment (1, 2, …;
    0 padding); per attention class c (`jaxrl.models.unpadded.Unpadded`) `rows[c]` [R·B_c, L_c] each class
    slot's position and `slots[c]` [R, N] each position's class slot; `predict_RM` the positions whose hidden
    states predict a completion token, `predictor_RN` the inverse (each position's m), `index_BT` the m
    predicting completion token (b, t) (0 off the real tokens)."""

    src_RN: np.ndarray
    segment_RN: np.ndarray
    rows: tuple
    slots: tuple
    predict_RM: np.ndarray
    predictor_RN: np.ndarray
    index_BT: np.ndarray

    def attention_pairs(self) -> float:
        """The causal pairs of the attention rows (`work`'s second term, per unit weight)."""
        return sum(r.shape[0] * r.shape[1] * (r.shape[1] + 1) / 2 for r in self.rows)


def predictable_spans(start_B, count_B, prompt_width: int, blocks: int):
    """(start_B, count_B as int64, rows per block) of rows to lay out in `blocks` equal blocks, or None when a
    row's first real token is a completion token (nothing predicts it: neither layout takes the batch)."""
    start_B, count_B = np.asarray(start_B, np.int64), np.asarray(count_B, np.int64)
    if len(start_B) % blocks:
        raise ValueError(f"{len(start_B)} rows do not split into {blocks} blocks")
    if np.any((count_B > 0) & (start_B >= prompt_width)):
        return None
    return start_B, count_B, len(start_B) // blocks


def unpadded_layout(start_B, count_B, prompt_width: int, length: int, blocks: int,
                    attention_weight: float = ATTENTION_WEIGHT) -> UnpaddedLayout | None:
    """The unpadded layout of B rows of width L = `length` (real tokens [start, start + count) of each row,
    contiguous) in `blocks` equal blocks, or None when no `ladder` width is below the block's B/R·L padded
    positions, or a row's first real token is a completion token (nothing predicts it). Attention classes:
    each block's rows by decreasing count (ties by row), `classes_of` equal groups (by `attention_weight`),
    each class as wide as the smallest `ladder(L, WIDTH_STEPS)` width holding its longest row in every block."""
    if (spans := predictable_spans(start_B, count_B, prompt_width, blocks)) is None:
        return None
    start_B, count_B, per = spans
    end_B = start_B + count_B
    b, w, t = len(start_B), prompt_width, length - prompt_width
    predicted_B = np.maximum(end_B - np.maximum(w, start_B + 1), 0)  # completion tokens with a predictor
    real = count_B.reshape(blocks, per).sum(1).max()
    n = next((c for c in ladder(per * length, WIDTH_STEPS) if c >= real), per * length)
    if n >= per * length:
        return None
    m = next(c for c in ladder(max(per * t, 1)) if c >= predicted_B.reshape(blocks, per).sum(1).max())
    c_num = classes_of(per, length, attention_weight)
    size = per // c_num
    order_KP = np.stack([sorted(range(per), key=lambda i, k=k: (-count_B[k * per + i], i)) for k in range(blocks)])
    rank_KP = np.argsort(order_KP, axis=1)  # each row's place by decreasing count: class, row in class
    longest_C = count_B.reshape(blocks, per)[np.arange(blocks)[:, None], order_KP].reshape(blocks, c_num, size)
    widths = [next(x for x in ladder(length, WIDTH_STEPS) if x >= max(longest_C[:, c].max(), 1))
              for c in range(c_num)]
    src_RN = np.full((blocks, n), -1, np.int32)
    segment_RN = np.zeros((blocks, n), np.int32)
    rows = [np.full((blocks * size, x), -1, np.int32) for x in widths]
    slots = [np.full((blocks, n), -1, np.int32) for _ in widths]
    predict_RM = np.full((blocks, m), -1, np.int32)
    predictor_RN = np.full((blocks, n), -1, np.int32)
    index_BT = np.zeros((b, t), np.int32)
    for k in range(blocks):
        at = j = 0
        for i in range(per):
            g, s0, c = k * per + i, int(start_B[k * per + i]), int(count_B[k * per + i])
            here = at + np.arange(c)
            src_RN[k, here] = i * length + s0 + np.arange(c)
            segment_RN[k, here] = i + 1
            cls, row = divmod(int(rank_KP[k, i]), size)
            rows[cls][k * size + row, :c] = here
            slots[cls][k, here] = row * widths[cls] + np.arange(c)
            p = np.arange(max(w, s0 + 1), s0 + c)  # the real completion positions of row g that are predicted
            predict_RM[k, j:j + len(p)] = at + p - 1 - s0
            predictor_RN[k, at + p - 1 - s0] = j + np.arange(len(p))
            index_BT[g, p - w] = j + np.arange(len(p))
            at, j = at + c, j + len(p)
    return UnpaddedLayout(src_RN, segment_RN, tuple(rows), tuple(slots), predict_RM, predictor_RN, index_BT)
