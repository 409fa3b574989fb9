"""Scoring completions with resolved rewards into an `[B, R]` reward matrix.

A reward that raises, returns None, NaN, ±inf or a non-number for a sample *fails* on that sample: it is
counted (`ScoreInfo.errors`, metric `reward/<name>/errors`), its first failure kept
(`ScoreInfo.first_failure`: the traceback, or which sample returned what), and the score replaced according
to `on_error`: "zero" → 0.0, "skip" → NaN (the advantage code excludes NaN entries). When a batched call
raises, the reward is re-run one sample at a time so that only the failing samples are affected. A reward
that returns the wrong number of scores is a bug and raises `UserError` naming it; a reward whose required
per-sample field is missing from the data raises `ConfigError`. `RewardFailureTracker`
(jaxrl.rewards.failures) stops a run whose reward keeps failing on every sample.
"""

from __future__ import annotations

import logging
import math
import traceback
from typing import Any, NamedTuple, Protocol, Sequence

import numpy as np

from jaxrl.errors import ConfigError, UserError
from jaxrl.rewards.specs import Reward, Rewards, resolve

log = logging.getLogger(__name__)


class RewardFn(Protocol):
    """`fn(prompts, completions, **params, **fields) -> list[float | None]`, one score per completion.

    `fields` holds per-sample lists aligned with `completions`: the dataset fields (the reference answer is
    always under `answer`) plus `completion_length` (generated token counts); a function receives the fields
    it names (all of them if it takes `**kwargs`).
    """

    def __call__(self, prompts: list[str], completions: list[str], **fields: Any) -> list[float | None]: ...


class ScoreInfo(NamedTuple):
    """What `score` reports besides the matrix.

    names: R reward names. weights_R: float32 [R]. errors: failed samples per reward. metrics:
    `reward/<name>/mean|errors`. num_samples: N. first_failure: per reward with a failure, its first one (a
    traceback, whose last line is the exception, or "sample i returned x").
    """

    names: tuple[str, ...]
    weights_R: np.ndarray
    errors: dict[str, int]
    metrics: dict[str, float]
    num_samples: int = 0
    first_failure: dict[str, str] = {}


def _valid(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))  # bools count as 1.0 / 0.0
    except (TypeError, ValueError):
        return False


def _call(reward: Reward, prompts: list[str], completions: list[str],
          fields: dict[str, Any]) -> tuple[list[Any], str]:
    """Scores of one reward and its first traceback ('' when nothing raised); a raising batch is retried per
    sample, and a raising sample scores None."""
    n = len(completions)
    first = ""
    try:
        out = list(reward.fn(prompts, completions, **fields))
    except Exception as e:  # noqa: BLE001 -- user code: isolate per sample below, then count
        first = traceback.format_exc()
        log.warning("reward %r raised %s: %s; retrying sample by sample", reward.name, type(e).__name__, e)
        out = []
        for i in range(n):
            try:
                one = list(reward.fn(prompts[i : i + 1], completions[i : i + 1],
                                     **{k: v[i : i + 1] for k, v in fields.items()}))
            except Exception:  # noqa: BLE001 -- counted as an error by the caller
                one = [None]
            if len(one) != 1:
                raise UserError(f"reward {reward.name!r} returned {len(one)} scores for 1 completion")
            out.extend(one)
    if len(out) != n:
        raise UserError(f"reward {reward.name!r} returned {len(out)} scores for {n} completions")
    return out, first


def score(
    rewards: Rewards | Sequence[Any], prompts: list[str], completions: list[str],
    fields: dict[str, Sequence[Any]] | None = None
) -> tuple[np.ndarray, ScoreInfo]:
    """Scores B completions with R rewards.

    Args:
      rewards: the `Rewards` from `resolve` (resolved once at setup). A sequence of `RewardSpec`s is still
        accepted and resolved on every call (kept for old callers; prefer `resolve` once).
      prompts: N prompt strings (repeated G times per prompt by the caller).
      completions: N completion strings.
      fields: per-sample sequences of length N (dataset fields, `completion_length`).

    Returns:
      rewards_BR: float32 [B, R]; NaN where a failing sample's reward has on_error="skip".
      info: `ScoreInfo` (names, weights_R float32 [R], failed-sample counts, first failures, metrics).
    """
    resolved = resolve(rewards)
    fields = dict(fields or {})
    n = len(completions)
    if len(prompts) != n or any(len(v) != n for v in fields.values()):
        bad = {k: len(v) for k, v in fields.items() if len(v) != n}
        raise ValueError(f"score: {n} completions but {len(prompts)} prompts and field lengths {bad}")
    rewards_BR = np.zeros((n, len(resolved)), np.float32)
    errors, metrics, first_failure = {}, {}, {}
    for k, reward in enumerate(resolved):
        missing = sorted(reward.required_fields - fields.keys())
        if missing:
            raise ConfigError(f"rewards[{reward.name}] needs the per-sample field {missing[0]!r}; "
                              f"the data has {', '.join(sorted(fields)) or 'no fields'}")
        raw, first = _call(reward, prompts, completions, reward.select(fields))
        ok = [_valid(x) for x in raw]
        fill = 0.0 if reward.on_error == "zero" else math.nan
        rewards_BR[:, k] = [float(x) if good else fill for x, good in zip(raw, ok)]
        errors[reward.name] = n - sum(ok)
        if errors[reward.name]:
            bad_i = ok.index(False)
            first_failure[reward.name] = first or f"sample {bad_i} returned {raw[bad_i]!r}"
            log.warning("reward %r: %d of %d samples failed (on_error=%s); first: %s", reward.name,
                        errors[reward.name], n, reward.on_error,
                        first_failure[reward.name].strip().splitlines()[-1])
        column = rewards_BR[:, k]
        finite = column[~np.isnan(column)]
        metrics[f"reward/{reward.name}/mean"] = float(finite.mean()) if finite.size else math.nan
        metrics[f"reward/{reward.name}/errors"] = float(errors[reward.name])
    return rewards_BR, ScoreInfo(resolved.names, resolved.weights_R, errors, metrics, n, first_failure)
