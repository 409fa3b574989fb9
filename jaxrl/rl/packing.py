"""Sequence packing of SFT rows: several demonstrations in one fixed-width row, so the update computes no padding.

A padded SFT batch holds B rows [prompt left-padded to W | completion right-padded to T]; in the warm starts of
the multi-turn configs 45-80% of those L = W + T positions are real tokens. Packing lays each row's real
tokens (prompt, completion and any environment tokens, in order) end to end into R rows of width L' ≤ L
(R·L' < B·L), first-fit by decreasing length (Johnson 1973), each sequence a segment: the model attends within a
segment only and restarts positions at its start (`Transformer.forward(segment_BL=...)`), so every token's
log-probability is the one it has alone in a padded row. The SFT loss is a token mean over the batch,

    L = Σ_{b,t} m[b,t]·(−log p(x[b,t] | x[b,<t])) / Σ m,

which does not depend on which row a token sits in: the packed batch has the padded batch's loss and
gradient up to float summation order (tests/train/test_packing.py). The same packing serves any host and
device layout: each batch shard (the rows one device holds) is packed into its own share of packed rows, so a
process packs exactly the demonstrations it built (`jaxrl.rl.agentic.demonstration_rows` builds only the rows
of its devices) and 2 processes x 2 devices pack like 1 x 4.

Static shapes: the packed rows per block and their width are chosen once per warm start
(`choose_layout`: the fewest token slots that hold every one of the first batches; the width can be below
the padded rows' own, down to the longest sequence), so the step compiles once; a later batch that does not
fit runs unpacked (the padded program, compiled the first time it is needed; every process takes the same
branch).

The packed batch is a `TrainBatch` in completion space with a one-token prompt: W' = 1, T' = L − 1, so the
hidden state at position t predicts token t + 1 for every t, and `completion_mask_BT` marks the targets
(the completion tokens of each segment; a segment's first token, a prompt token, is never a target).
Only SFT rows (SFT weight 1, no per-row RL quantities) are packed.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Sharding

from jaxrl.learner.train_step import TrainBatch

CLIP = 0.2  # the clip bounds of expert rows (unused by the SFT loss; kept like `expert_rows`)


def sequences(batch: TrainBatch, rows) -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens_n, target_n) of each of `rows`: the row's real tokens in order, and which of them are trained
    on (completion tokens under `completion_mask_BT`)."""
    tokens_BL, mask_BL = np.asarray(batch.tokens_BL), np.asarray(batch.mask_BL, bool)
    cmask_BT = np.asarray(batch.completion_mask_BT, bool)
    w = tokens_BL.shape[1] - cmask_BT.shape[1]
    out = []
    for b in rows:
        idx = np.flatnonzero(mask_BL[b])
        target = np.zeros(idx.shape, bool)
        comp = idx >= w
        target[comp] = cmask_BT[b, idx[comp] - w]
        if target.size and target[0]:
            raise ValueError(f"row {b}: its first real token is a training target (no prompt to predict it)")
        out.append((tokens_BL[b, idx], target))
    return out


def first_fit(lengths: list[int], width: int) -> list[list[int]]:
    """Bins (lists of item indices, in placement order) of first-fit decreasing: items by decreasing length
    (ties by index), each into the first bin with room, else a new bin."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if lengths[i] > width:
            raise ValueError(f"a sequence of {lengths[i]} tokens does not fit a packed row of {width}")
        k = next((j for j, r in enumerate(room) if r >= lengths[i]), None)
        if k is None:
            bins.append([])
            room.append(width)
            k = len(bins) - 1
        bins[k].append(i)
        room[k] -= lengths[i]
    return bins


def blocks(sharding: Sharding, rows: int) -> tuple[int, list[int], dict]:
    """(number of row blocks, the blocks this process holds, block index of every device) of an array of
    `rows` rows laid out by `sharding` (equal contiguous blocks, one per distinct device shard)."""
    index = {d: (range(rows)[i[0]] if i else range(rows)) for d, i in sharding.devices_indices_map((rows,)).items()}
    size = len(next(iter(index.values())))
    of_device = {d: r.start // max(size, 1) for d, r in index.items()}
    me = jax.process_index()
    held = sorted({k for d, k in of_device.items() if d.process_index == me})
    return rows // max(size, 1), held, of_device


def block_rows(rows: int, num_blocks: int, k: int) -> range:
    """Rows of block k of `num_blocks` equal blocks of `rows` rows."""
    size = rows // num_blocks
    return range(k * size, (k + 1) * size)


def rows_needed(batch: TrainBatch, num_blocks: int, held: list[int], width: int | None = None) -> int:
    """The most packed rows of `width` (default: the batch's) any held block of `batch` needs (a sequence
    longer than `width` needs more rows than any batch has)."""
    rows, full = np.shape(batch.tokens_BL)
    width = full if width is None else width
    most = 0
    for k in held:
        lengths = [len(t) for t, _ in sequences(batch, block_rows(rows, num_blocks, k))]
        if max(lengths, default=0) > width:
            return rows + 1
        most = max(most, len(first_fit(lengths, width)))
    return most


def choose_layout(probe: list[TrainBatch], num_blocks: int, held: list[int], *, multiple: int = 16
                  ) -> tuple[int, int] | None:
    """(rows per block, width) of the packed batches that hold every `probe` batch, with a row to spare (the
    probe is a sample: on the quickstart's warm start 4 of 336 later batches needed one more row than its
    first 64), in the fewest token slots (rows x width; ties: the narrower), over widths from the longest
    sequence (rounded up to `multiple`) to the batches' own width; None when that saves nothing over the
    padded layout."""
    rows, full = np.shape(probe[0].tokens_BL)
    per_block = rows // num_blocks
    longest = max(len(t) for b in probe for k in held for t, _ in sequences(b, block_rows(rows, num_blocks, k)))
    best = (per_block * full, per_block, full)
    for width in range(-(-longest // multiple) * multiple, full, multiple):
        need = min(max(rows_needed(b, num_blocks, held, width) for b in probe) + 1, per_block)
        best = min(best, (need * width, need, width))
    return None if best[2] == full and best[1] >= per_block else (best[1], best[2])


def pack(batch: TrainBatch, num_blocks: int, held: list[int], rows_per_block: int,
         width: int | None = None) -> TrainBatch | None:
    """`batch`'s rows packed block by block into `rows_per_block` rows of `width` tokens (default: the
    batch's width) each (block k of the input into rows [k·r, (k+1)·r) of the output), or None when a held
    block needs more rows or has a longer sequence. Blocks not held (other processes' rows) stay empty."""
    sft = np.asarray(batch.sft_weight_B)
    if not np.all(sft == 1.0) or batch.segment_BL is not None or batch.group != 1:
        raise ValueError("only unpacked SFT rows (SFT weight 1, no prompt groups) are packed")
    rows, full = np.shape(batch.tokens_BL)
    width = full if width is None else width
    n = rows_per_block * num_blocks
    tokens = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), bool)
    target = np.zeros((n, width), bool)
    segment = np.zeros((n, width), np.int32)
    for k in held:
        seqs = sequences(batch, block_rows(rows, num_blocks, k))
        if any(len(t) > width for t, _ in seqs):
            return None
        bins = first_fit([len(t) for t, _ in seqs], width)
        if len(bins) > rows_per_block:
            return None
        for j, items in enumerate(bins):
            row, at = k * rows_per_block + j, 0
            for seg, i in enumerate(items, start=1):
                t, m = seqs[i]
                cols = slice(at, at + len(t))
                tokens[row, cols], target[row, cols], mask[row, cols], segment[row, cols] = t, m, True, seg
                at += len(t)
    zeros = np.zeros((n, width - 1), np.float32)
    ones = np.ones((n,), np.float32)
    return TrainBatch(tokens, mask, target[:, 1:], zeros, zeros, zeros, ones * CLIP, ones * CLIP, ones,
                      segment_BL=segment)
