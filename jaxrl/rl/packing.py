"""Sequence packing: several sequences in one fixed-width row, so the update computes (almost) no padding.

Two users: the SFT warm start (`pack`, below: demonstrations rewritten into packed completion space) and the
RL update (`rl_layout`, `RLPacker`, at the end: only the forward runs packed, the loss keeps the padded
[B, T] layout; `train.packing: auto`).

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

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Sharding

from jaxrl.learner.packed import PackedRows, UnpaddedRows, gather_blocks
from jaxrl.learner.train_step import TrainBatch
from jaxrl.rl.batch import rows_multiple_of
from jaxrl.rl.unpadding import (ATTENTION_WEIGHT, UnpaddedLayout, ladder, predictable_spans, unpadded_layout,
                                work)
from jaxrl.sharding import batch_shardings, hosts

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


# --- RL rows: the update's forward over packed rows, the loss on the padded [B, T] layout -------------------
#
# `pack` above rewrites SFT rows into packed completion space. An RL row carries per-token and per-row
# quantities (advantages, old / reference log-probs, clip bounds, sequence-level aggregation), so an RL batch
# keeps its padded [B, T] tensors and only its forward runs packed (`jaxrl.learner.packed`): `rl_layout` says
# where each row's real tokens go and where each completion token's log-prob comes from, `RLPacker` builds
# the packed rows on the devices and decides, per mini-batch, whether packing saves work.

def row_spans(mask_BL: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start_B, count_B, contiguous_B): each row's first real position, its number of real tokens, and
    whether those are one contiguous run (a left-padded prompt followed by a right-padded completion)."""
    mask_BL = np.asarray(mask_BL, bool)
    length = mask_BL.shape[1]
    count_B = mask_BL.sum(axis=1)
    start_B = np.argmax(mask_BL, axis=1)
    last_B = length - 1 - np.argmax(mask_BL[:, ::-1], axis=1)
    contiguous_B = (count_B == 0) | (last_B - start_B + 1 == count_B)
    return start_B, count_B, contiguous_B


@dataclasses.dataclass(frozen=True)
class RLLayout:
    """Where a batch's real tokens go: `src_RL` the block-local flat source position (row-in-block·L + column)
    of each packed slot (−1: padding), `segment_RL` its segment (0: padding), `index_BT` the block-local flat
    packed position predicting each completion token (`jaxrl.learner.packed.PackedRows.index_BT`)."""

    rows_per_block: int
    src_RL: np.ndarray
    segment_RL: np.ndarray
    index_BT: np.ndarray


def rl_layout(start_B, count_B, prompt_width: int, length: int, blocks: int) -> RLLayout | None:
    """The packed layout of B rows of width L = `length` (real tokens [start, start + count) of each row,
    contiguous) in `blocks` equal blocks of consecutive rows: each block's rows first-fit decreasing into
    rows of width L, every block given the same number of packed rows (the smallest `ladder` size that holds
    the fullest block), or None when that is not fewer rows than the block's own. A row whose first real
    token is a completion token (no prompt to predict it from) makes the batch unpackable (None)."""
    spans = predictable_spans(start_B, count_B, prompt_width, blocks)
    if spans is None:
        return None
    start_B, count_B, per = spans
    b, w = len(start_B), prompt_width
    t = length - w
    bins_k = [first_fit(count_B[k * per:(k + 1) * per].tolist(), length) for k in range(blocks)]
    need = max(len(bins) for bins in bins_k)
    rows = next(c for c in ladder(per) if c >= need)
    if rows >= per:
        return None
    src_RL = np.full((blocks * rows, length), -1, np.int32)
    segment_RL = np.zeros((blocks * rows, length), np.int32)
    index_BT = np.zeros((b, t), np.int32)
    for k, bins in enumerate(bins_k):
        for j, items in enumerate(bins):
            row, at = k * rows + j, 0
            for seg, i in enumerate(items, start=1):
                g, n, s0 = k * per + i, int(count_B[k * per + i]), int(start_B[k * per + i])
                src_RL[row, at:at + n] = i * length + s0 + np.arange(n)
                segment_RL[row, at:at + n] = seg
                p = np.arange(max(w, s0 + 1), s0 + n)  # the real completion positions of row g
                index_BT[g, p - w] = j * length + at + (p - 1 - s0)
                at += n
    return RLLayout(rows, src_RL, segment_RL, index_BT)


def padded_work(rows: int, prompt_width: int, length: int, group: int) -> int:
    """Token positions the unpacked forward computes: B·L, or P·W + B·T with shared prompts (G > 1)."""
    if group > 1:
        return rows // group * prompt_width + rows * (length - prompt_width)
    return rows * length


LAYOUTS = {"auto": ("rows", "unpadded"), "rows": ("rows",), "unpadded": ("unpadded",)}  # `train.packing`'s


def rl_plan(mask_BL, prompt_width: int, group: int, blocks: int, attention_weight: float = ATTENTION_WEIGHT,
            layouts: tuple[str, ...] = LAYOUTS["auto"]) -> RLLayout | UnpaddedLayout | None:
    """`train.packing`'s decision for a batch of real-token mask `mask_BL` (host array): the layout of least
    `unpadding.work` among the padded rows (None; shared prompts for `group` > 1) and, of `layouts`, the
    packed rows ("rows", `rl_layout`) and the unpadded rows ("unpadded", `unpadded_layout`), the latter two
    only when every row's real tokens are contiguous."""
    rows, length = np.shape(mask_BL)
    start_B, count_B, contiguous_B = row_spans(mask_BL)
    if not contiguous_B.all():
        return None
    w, t = prompt_width, length - prompt_width
    if group > 1:  # prompts once per group: P rows of W, then B completions over [W prompt | T own] keys
        padded = (work(padded_work(rows, w, length, group), rows // group, w, attention_weight)
                  + attention_weight * rows * t * (w + (t + 1) / 2))
    else:
        padded = work(rows * length, rows, length, attention_weight)
    candidates = [(padded, None)]  # (work, layout): the first of least work wins
    packed = rl_layout(start_B, count_B, w, length, blocks) if "rows" in layouts else None
    if packed is not None:
        r = packed.src_RL.shape[0]
        candidates.append((work(r * length, r, length, attention_weight), packed))
    unpadded = unpadded_layout(start_B, count_B, w, length, blocks, attention_weight) if "unpadded" in layouts else None
    if unpadded is not None:
        candidates.append((unpadded.src_RN.size + attention_weight * unpadded.attention_pairs(), unpadded))
    return min(candidates, key=lambda c: c[0])[1]


@functools.lru_cache(maxsize=None)
def _gather_tokens(out: Sharding, rows_per_block: int):
    """tokens_RL[r, c] = the block-local source token src_RL[r, c] of tokens_BL (0 where src is −1)."""
    def gather(tokens_BL, src_RL):
        blocks = src_RL.shape[0] // rows_per_block
        got_RL = gather_blocks(tokens_BL, jnp.maximum(src_RL, 0), tokens_BL.shape[0] // blocks)
        return jnp.where(src_RL >= 0, got_RL, 0)

    return jax.jit(gather, out_shardings=out)


@dataclasses.dataclass(frozen=True)
class RLPacker:
    """`train.packing: auto`: (mini-batch) -> (the mini-batch, packed or unpadded where that computes less
    (`rl_plan`, pairs of attention weighed by `attention_weight`), and {"train/packed": 0 | 1,
    "train/unpadded": 0 | 1, "train/packed_rows": the fraction of the padded positions the forward computes}).

    Blocks: `blocks` = lcm(batch shards, micro-batches), so a block's packed rows sit on the device of its
    rows and in its micro-batch (`jaxrl.learner.train_step.accumulate` splits rows and packed rows alike). The
    layout is computed on every host from the whole batch's row spans (B integers), so every host packs
    alike; a packed batch runs the unshared program (`group` 1).

    The packed rows depend only on the batch's tokens and mask (and `group`), so the last ones are kept: the
    log-prob passes of `assemble` and the update's mini-batch of a whole batch (every PPO epoch) pack once."""

    mesh: Any
    rules: Any
    blocks: int
    attention_weight: float = ATTENTION_WEIGHT
    layouts: tuple[str, ...] = LAYOUTS["auto"]
    _last: list = dataclasses.field(default_factory=list, compare=False, repr=False)  # [(tokens, mask, G, packed, info)]

    def __call__(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        last = self._last[0] if self._last else None
        if not (last and last[0] is batch.tokens_BL and last[1] is batch.mask_BL and last[2] == batch.group):
            self._last[:] = [(batch.tokens_BL, batch.mask_BL, batch.group, *self._pack(batch))]
        *_, packed, info = self._last[0]
        return (batch if packed is None else batch.replace(packed=packed, group=1)), info

    def _pack(self, batch: TrainBatch) -> tuple[PackedRows | None, dict[str, float]]:
        rows, length = batch.tokens_BL.shape
        w = length - batch.completion_mask_BT.shape[1]
        layout = rl_plan(hosts.to_host(batch.mask_BL), w, batch.group, self.blocks, self.attention_weight,
                         self.layouts)
        if layout is None:
            return None, {"train/packed": 0.0, "train/unpadded": 0.0, "train/packed_rows": 1.0}
        place = lambda x: hosts.host_to_global(x, self._rows(x))
        if isinstance(layout, UnpaddedLayout):  # one row per block
            src_RL, segment_RL, per_block = layout.src_RN, layout.segment_RN, 1
            unpadded = UnpaddedRows(tuple(map(place, layout.rows)), tuple(map(place, layout.slots)),
                                    place(layout.predict_RM), place(layout.predictor_RN))
        else:
            src_RL, segment_RL, per_block = layout.src_RL, layout.segment_RL, layout.rows_per_block
            unpadded = None
        tokens_RL = _gather_tokens(self._rows(src_RL), per_block)(batch.tokens_BL, place(src_RL))
        packed = PackedRows(tokens_RL, place(segment_RL > 0), place(segment_RL), place(layout.index_BT),
                            rows_per_block=per_block, unpadded=unpadded)
        return packed, {"train/packed": 1.0, "train/unpadded": float(unpadded is not None),
                        "train/packed_rows": src_RL.size / (rows * length)}

    def _rows(self, x: np.ndarray) -> Sharding:
        return batch_shardings(jax.ShapeDtypeStruct(x.shape, x.dtype), self.mesh, self.rules)


def packer_for(mode: str, mesh, rules, grad_accum: int, attention_weight: float = ATTENTION_WEIGHT
               ) -> RLPacker | None:
    """`train.packing`'s packer ("auto", "rows", "unpadded"; None for "off"): its blocks one per batch shard
    and micro-batch; `attention_weight`: the model's (`unpadding.attention_weight_of`)."""
    if mode == "off":
        return None
    return RLPacker(mesh, rules, blocks=math.lcm(rows_multiple_of(mesh, rules, 1, 1), grad_accum),
                    attention_weight=attention_weight, layouts=LAYOUTS[mode])
