"""Resolving reward specs into callables and scoring completions into an `[N, K]` reward matrix.

A reward that raises, returns None, NaN or ±inf for a sample is *counted* (`reward/<name>/errors`) and
replaced
according to its `on_error`: "zero" → 0.0, "skip" → NaN (the advantage code excludes NaN entries). When a
batched
call raises, the reward is re-run one sample at a time so that only the failing samples are affected. A reward
that returns a list of the wrong length is a bug and raises `UserError` naming it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np

from jaxrl.errors import ConfigError, UserError
from jaxrl.rewards.answers import exact_answer, math_answer
from jaxrl.rewards.countdown import countdown
from jaxrl.rewards.gym import reasoning_gym_score
from jaxrl.rewards.model_reward import model_reward, pairwise_reward
from jaxrl.rewards.shaping import format_reward, length_penalty, overlong_penalty

log = logging.getLogger(__name__)


class RewardFn(Protocol):
    """`fn(prompts, completions, **fields) -> list[float | None]`, one score per completion.

    `fields` holds per-sample lists aligned with `completions`: the dataset fields (the reference answer is
    always under `answer`) plus `completion_length` (generated token counts).
    """

    def __call__(self, prompts: list[str], completions: list[str], **fields: Any) -> list[float | None]: ...


# type name -> built-in reward function. Explicit and greppable (STYLE.md principle 15).
BUILTINS: dict[str, Callable[..., list[float]]] = {
    "math_answer": math_answer,
    "exact_answer": exact_answer,
    "format": format_reward,
    "length": length_penalty,
    "overlong": overlong_penalty,
    "countdown": countdown,
    "reasoning_gym": reasoning_gym_score,
    "model": model_reward,  # params: {checkpoint: RM run dir / HF SequenceClassification dir}
    "pairwise": pairwise_reward,  # params: {judge: "module:function", group_size: G}
}


class Reward(NamedTuple):
    """A resolved reward: the spec's name, weight and error policy plus the callable (params bound)."""

    name: str
    fn: RewardFn
    weight: float
    on_error: str


class ScoreInfo(NamedTuple):
    names: tuple[str, ...]
    weights_K: np.ndarray
    errors: dict[str, int]
    metrics: dict[str, float]


def _import_function(ref: str, where: str) -> Callable[..., Any]:
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{where}={ref!r}: cannot import module {module_name!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{where}={ref!r}: module {module_name!r} has no function {attr!r}")
    return fn


def build_reward(spec: Any) -> Reward:
    """Resolves one `jaxrl.config.RewardSpec`: a built-in `type`, or `type: function` + "module:function"."""
    if spec.type == "function":
        fn = _import_function(spec.function, f"rewards[{spec.name}].function")
    elif spec.type in BUILTINS:
        fn = BUILTINS[spec.type]
    else:
        allowed = ", ".join(map(repr, [*BUILTINS, "function"]))
        raise ConfigError(f"rewards[{spec.name}].type={spec.type!r}: allowed values are {allowed}")
    bound = functools.partial(fn, **spec.params) if spec.params else fn
    return Reward(spec.name, bound, float(spec.weight), spec.on_error)


def build_rewards(specs: Sequence[Any]) -> tuple[Reward, ...]:
    return tuple(s if isinstance(s, Reward) else build_reward(s) for s in specs)


def _valid(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))  # bools count as 1.0 / 0.0
    except (TypeError, ValueError):
        return False


def _call(reward: Reward, prompts: list[str], completions: list[str], fields: dict[str, list]) -> list[Any]:
    """Scores of one reward; a raising batch is retried per sample, a raising sample scores None."""
    n = len(completions)
    try:
        out = list(reward.fn(prompts, completions, **fields))
    except Exception as e:  # noqa: BLE001 -- user code: isolate per sample below, then count
        log.warning("reward %r raised %s: %s; retrying sample by sample", reward.name, type(e).__name__, e)
        out = []
        for i in range(n):
            try:
                out.extend(
                    reward.fn(
                        prompts[i : i + 1],
                        completions[i : i + 1],
                        **{k: v[i : i + 1] for k, v in fields.items()},
                    )
                )
            except Exception:  # noqa: BLE001 -- counted as an error by the caller
                out.append(None)
    if len(out) != n:
        raise UserError(f"reward {reward.name!r} returned {len(out)} scores for {n} completions")
    return out


def score(
    rewards: Sequence[Any], prompts: list[str], completions: list[str], fields: dict[str, list] | None = None
) -> tuple[np.ndarray, ScoreInfo]:
    """Scores N completions with K rewards.

    Args:
      rewards: K `RewardSpec`s (or already built `Reward`s).
      prompts: N prompt strings (repeated G times per prompt by the caller).
      completions: N completion strings.
      fields: per-sample lists of length N (dataset fields, `completion_length`).

    Returns:
      rewards_NK: float32 [N, K]; NaN where a failing sample's reward has on_error="skip".
      info: names, weights_K (float32 [K]), error counts and metrics `reward/<name>/mean|errors`.
    """
    fields = dict(fields or {})
    n = len(completions)
    if len(prompts) != n or any(len(v) != n for v in fields.values()):
        bad = {k: len(v) for k, v in fields.items() if len(v) != n}
        raise ValueError(f"score: {n} completions but {len(prompts)} prompts and field lengths {bad}")
    built = build_rewards(rewards)
    rewards_NK = np.zeros((n, len(built)), np.float32)
    errors, metrics = {}, {}
    for k, reward in enumerate(built):
        raw = _call(reward, prompts, completions, fields)
        ok = [_valid(x) for x in raw]
        fill = 0.0 if reward.on_error == "zero" else math.nan
        rewards_NK[:, k] = [float(x) if good else fill for x, good in zip(raw, ok)]
        errors[reward.name] = n - sum(ok)
        if errors[reward.name]:
            log.warning(
                "reward %r: %d of %d samples failed (on_error=%s)",
                reward.name,
                errors[reward.name],
                n,
                reward.on_error,
            )
        column = rewards_NK[:, k]
        finite = column[~np.isnan(column)]
        metrics[f"reward/{reward.name}/mean"] = float(finite.mean()) if finite.size else math.nan
        metrics[f"reward/{reward.name}/errors"] = float(errors[reward.name])
    weights_K = np.asarray([r.weight for r in built], np.float32)
    return rewards_NK, ScoreInfo(tuple(r.name for r in built), weights_K, errors, metrics)
