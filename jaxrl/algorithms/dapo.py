"""DAPO dynamic sampling (arXiv:2503.14476 §3.2): resample until the batch is full of informative groups.

A group is kept when the summed *task* reward of its samples is not all equal (the recipe filters on `acc`,
the score before the overlong penalty: `AlgoSettings.task_columns`, or the rewards `algorithm.params.
filter_rewards` names), so an all-wrong group is not kept for its length penalty alone. Rounds stop when P
informative groups are found or after `algorithm.params.max_tries` extra rollouts; the batch is then filled
with degenerate groups (advantage 0).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxrl._checks import check as _check
from jaxrl.algorithms.base import AlgoSettings, task_reward
from jaxrl.sampling.rollout_rows import concat, select_groups
from jaxrl.types import Rollout


@dataclasses.dataclass(frozen=True)
class DAPOParams:
    """`algorithm.params` of dapo: resampling rounds per step (0 = off), and the rewards whose sum decides
    whether a group is kept (empty: every reward except the length shaping ones, i.e. the recipe's `acc`)."""

    max_tries: int = 8
    filter_rewards: tuple[str, ...] = ()

    def __post_init__(self):
        _check(self.max_tries >= 0, "algorithm.params.max_tries", self.max_tries, "must be >= 0")


def filter_columns(params: DAPOParams, reward_names: tuple[str, ...]) -> tuple[int, ...] | None:
    """The reward columns `filter_rewards` names (None: not set, the run's task columns decide); a name that
    is not one of the run's rewards is a ConfigError (at setup, before any model is built)."""
    if not params.filter_rewards:
        return None
    unknown = sorted(set(params.filter_rewards) - set(reward_names))
    _check(not unknown, "algorithm.params.filter_rewards", list(params.filter_rewards),
           f"{unknown} are not reward names ({list(reward_names)})")
    return tuple(reward_names.index(n) for n in params.filter_rewards)


def informative_groups(ro: Rollout, s: AlgoSettings) -> np.ndarray:
    """[P] bool: groups whose task rewards are not all equal (`losses.dynamic_sampling_mask`, on the host:
    the merged batch changes size every round, and a jnp version would compile for each size)."""
    return np.ptp(task_reward(ro.rewards_BR, ro.weights_R, s).reshape(-1, s.group_size), axis=1) > 0


def dynamic_sampling(first: Rollout, collect: Callable[[int], Rollout], s: AlgoSettings
                     ) -> tuple[Rollout, dict[str, float]]:
    """Resampling stage: `collect(round)` draws one more rollout of the same prompts with a fresh seed."""
    g = s.group_size
    p = first.tokens_BL.shape[0] // g
    parts, tries = [first], 0
    while sum(int(informative_groups(x, s).sum()) for x in parts) < p and tries < s.params.max_tries:
        tries += 1
        parts.append(collect(tries))
    keep = np.concatenate([informative_groups(x, s) for x in parts])
    good, bad = np.flatnonzero(keep), np.flatnonzero(~keep)
    metrics = {"dapo/resample_rounds": float(tries), "dapo/kept_groups_frac": float(min(len(good), p) / p)}
    if len(parts) == 1:  # nothing drawn again: every group, in order (no row moves)
        return first, metrics
    # Widening a prompt writes the run's pad token (any masked position holds it; with none, the value is
    # never read: masked positions do not reach the loss or other rows). Device token arrays: the merged
    # rows and the kept ones are jitted gathers, one compile per number of rounds (at most max_tries).
    pad_id = first.pad_id
    if pad_id is None:
        pad_id = int(np.asarray(first.tokens_BL)[~first.mask_BL][0]) if (~first.mask_BL).any() else 0
    chosen = np.sort(np.concatenate([good, bad])[:p])
    return select_groups(concat(parts, pad_id), chosen, g), metrics
