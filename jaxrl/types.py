"""The row model of the RL middle: what every producer of sequences returns and what a rollout adds to it.

    Rows      tokens_BL, mask_BL | completion_mask_BT, old_logp_BT | lengths_B, finished_B | completions
              (the sampler's completions, environment episodes, a multi-agent role's generation)
    Rollout   Rows + records, rewards_BR, weights_R, reward_names, segments, metrics, score_infos

Layout (completion space): `tokens_BL = [left-padded prompt | completion, padded after its end]` with
L = W + T (W the prompt width, T the completion width); only the forward pass reads full rows, everything the
loss reads is [B, T], aligned with `tokens_BL[:, W:]`. `mask_BL` marks real tokens (the forward's attention
mask), `completion_mask_BT` the tokens that are trained (sampled tokens; an environment's observation tokens
are real but not trained), `old_logp_BT` the sampler's log-probs of the trained tokens (0 elsewhere).

Dimension letters: B rows, L full row, W prompt, T completion, R reward columns, P prompts, G samples per
prompt, S samples of a role per chain, U turns of an episode. `tokens_BL` and `old_logp_BT` may be host numpy
arrays or global `jax.Array`s split over the batch axis (single-turn rows stay on the devices;
`jaxrl.sharding.rows` moves them); the masks, lengths and texts are host values, the same on every host.

This module imports numpy only: every layer may use it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Rows:
    """B sequences in completion space. `role`: the multi-agent role that produced them ("" for one policy)."""

    tokens_BL: Any  # int32 [B, L]
    mask_BL: np.ndarray  # bool [B, L]
    completion_mask_BT: np.ndarray  # bool [B, T]
    old_logp_BT: Any  # float32 [B, T]
    lengths_B: np.ndarray  # int32 [B] completion lengths
    finished_B: np.ndarray  # bool [B] ended by EOS / the environment (False: cut by a budget)
    completions: list[str]  # decoded completion text ("" at rows another host decoded)
    role: str = ""

    @property
    def prompt_width(self) -> int:
        return self.tokens_BL.shape[1] - self.completion_mask_BT.shape[1]

    def take(self, rows, take_array: Callable | None = None) -> "Rows":
        """The given rows, in order. `take_array(x, rows)` takes the rows of `tokens_BL` and `old_logp_BT`
        (default: host indexing; `jaxrl.sharding.rows.take` also moves rows held on the devices)."""
        rows = np.asarray(rows, np.int64)
        take_array = take_array or _host_take
        return dataclasses.replace(
            self, tokens_BL=take_array(self.tokens_BL, rows), mask_BL=self.mask_BL[rows],
            completion_mask_BT=self.completion_mask_BT[rows], old_logp_BT=take_array(self.old_logp_BT, rows),
            lengths_B=self.lengths_B[rows], finished_B=self.finished_B[rows],
            completions=[self.completions[i] for i in rows])


@dataclasses.dataclass(frozen=True)
class Rollout(Rows):
    """One rollout batch: B rows (for one policy B = P·G, the rows of a prompt contiguous) with their records
    and rewards."""

    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # each row's dataset record
    rewards_BR: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.float32))
    weights_R: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.float32))
    reward_names: tuple[str, ...] = ()
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    score_infos: tuple = ()  # the `jaxrl.rewards.ScoreInfo` of each scoring call (one per DAPO round)
    # Segments (a multi-agent system's roles): rows with equal `segment_B` are normalised together, in groups
    # of `segment_sizes[id]` consecutive rows of that segment; None: one segment, the run's group size.
    segment_B: np.ndarray | None = None
    segment_sizes: tuple[int, ...] = ()
    pad_id: int | None = None  # the token written where `mask_BL` is off (None: not recorded)
    # int32 [B, T]: the policy version that sampled each completion token (partial rollouts, `jaxrl.rl.partial`);
    # None: one version sampled the whole rollout
    version_BT: np.ndarray | None = None

    @classmethod
    def of(cls, rows: Rows, **fields) -> "Rollout":
        """A rollout of `rows` with the given rollout fields."""
        return cls(**{f.name: getattr(rows, f.name) for f in dataclasses.fields(Rows)}, **fields)

    def take(self, rows, take_array: Callable | None = None) -> "Rollout":
        """`Rows.take` with each row's record, rewards and segment (metrics and score infos kept as they are)."""
        rows = np.asarray(rows, np.int64)
        return dataclasses.replace(
            super().take(rows, take_array), records=[self.records[i] for i in rows], rewards_BR=self.rewards_BR[rows],
            segment_B=None if self.segment_B is None else self.segment_B[rows],
            version_BT=None if self.version_BT is None else self.version_BT[rows])

    def add_reward_column(self, values_B: np.ndarray, name: str) -> "Rollout":
        """A copy with one more reward column of weight 1 (a shaping stage's output)."""
        return dataclasses.replace(
            self, rewards_BR=np.concatenate([self.rewards_BR, values_B[:, None].astype(np.float32)], axis=1),
            weights_R=np.concatenate([self.weights_R, np.ones((1,), np.float32)]),
            reward_names=(*self.reward_names, name))


def _host_take(x, rows: np.ndarray):
    return np.asarray(x)[rows]
