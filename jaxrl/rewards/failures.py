"""Stopping a run whose reward keeps failing: `RewardFailureTracker` and `RewardError`.

A reward that raises (or returns None / NaN) on every sample teaches the policy nothing: with on_error="zero"
every advantage is 0, with "skip" every sample is excluded. The train loop calls
`tracker.update(*score_infos)` once per step with the `ScoreInfo`s of that step's scoring calls (several when
DAPO resamples); a reward that failed on all of the step's samples for `max_failed_steps` consecutive steps
raises `RewardError`, after logging its first full traceback. One sample that scores resets the count.
"""

from __future__ import annotations

import logging

from jaxrl.errors import UserError
from jaxrl.rewards.score import ScoreInfo

log = logging.getLogger(__name__)


class RewardError(UserError):
    """A reward failed on every sample for too many consecutive steps (the message names it and its error)."""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "unknown error"


class RewardFailureTracker:
    """Counts, per reward, consecutive steps on which it failed on every sample.

    Args:
      max_failed_steps: how many consecutive all-failed steps stop the run (>= 1; the config's
        `train.max_failed_reward_steps`, default 3).
    """

    def __init__(self, max_failed_steps: int = 3):
        is_int = isinstance(max_failed_steps, int) and not isinstance(max_failed_steps, bool)
        if not is_int or max_failed_steps < 1:
            raise UserError(f"train.max_failed_reward_steps={max_failed_steps!r}: must be an integer >= 1")
        self.max_failed_steps = max_failed_steps
        self._streak: dict[str, int] = {}
        self._first: dict[str, str] = {}

    @property
    def streaks(self) -> dict[str, int]:
        """Consecutive all-failed steps so far, per reward name."""
        return dict(self._streak)

    def update(self, *infos: ScoreInfo) -> None:
        """Records one training step's scoring; raises RewardError when a reward hits the limit.

        Args:
          infos: the `ScoreInfo`s of every `score` call of this step (one, or one per DAPO resampling round).
        """
        names = list(dict.fromkeys(name for info in infos for name in info.names))
        for name in names:
            total = sum(info.num_samples for info in infos if name in info.names)
            failed = sum(info.errors.get(name, 0) for info in infos)
            if total == 0 or failed < total:
                self._streak[name] = 0
                self._first.pop(name, None)
                continue
            self._streak[name] = self._streak.get(name, 0) + 1
            if name not in self._first:
                self._first[name] = next(
                    (i.first_failure[name] for i in infos if name in i.first_failure), "no failure recorded"
                )
            if self._streak[name] >= self.max_failed_steps:
                first = self._first[name]
                log.error("reward %r failed on every sample for %d consecutive steps; first failure:\n%s",
                          name, self._streak[name], first.rstrip())
                raise RewardError(
                    f"reward {name!r} failed on every sample for {self._streak[name]} consecutive steps "
                    f"(train.max_failed_reward_steps={self.max_failed_steps}); first error: {_last_line(first)}"
                )
