"""The built-in reward types: function, the per-sample fields it reads, and a check of its params.

A built-in declares every keyword it takes (no `**kwargs`), so `jaxrl.rewards.resolve` can tell a misspelt
param from a real one. Its keywords are split into *fields* (per-sample lists the rollout passes: dataset
columns and `completion_length`) and *params* (the spec's `params:`, bound once at resolve). `check(params)`
(params with the function's defaults filled in) raises ValueError("params.<key>=<value>: <what is allowed>")
for a bad value, cheaply (no model loading); resolve prefixes it with `rewards[<name>].`.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from jaxrl.rewards.answers import exact_answer, math_answer, require_math_verify
from jaxrl.rewards.countdown import countdown
from jaxrl.rewards.gym import reasoning_gym_score
from jaxrl.rewards.imports import import_function
from jaxrl.rewards.model_reward import model_reward, pairwise_reward
from jaxrl.rewards.shaping import format_reward, length_penalty, overlong_penalty


class Builtin(NamedTuple):
    """A built-in reward: `fn(prompts, completions, **fields, **params)`, its fields and its param check."""

    fn: Callable[..., list]
    fields: tuple[str, ...]
    check: Callable[[Mapping[str, Any]], None] | None = None


def _check_math(p: Mapping[str, Any]) -> None:
    if p["use_math_verify"]:
        try:
            require_math_verify()
        except ImportError as e:
            raise ValueError(f"params.use_math_verify=True: {e}; or set use_math_verify: false") from None


def _check_format(p: Mapping[str, Any]) -> None:
    if p["pattern"] is None and not p["tags"]:
        raise ValueError("params: the format reward needs pattern (a regex) and/or tags (a list of tag "
                         "names)")
    if p["pattern"] is not None:
        try:
            re.compile(p["pattern"])
        except re.error as e:
            raise ValueError(f"params.pattern={p['pattern']!r}: not a valid regex ({e})") from None
    tags = p["tags"]
    if isinstance(tags, str) or not all(isinstance(t, str) and t for t in tags):
        raise ValueError(f"params.tags={tags!r}: must be a list of non-empty tag names")


def _check_length(p: Mapping[str, Any]) -> None:
    if p["target"] < 1:
        raise ValueError(f"params.target={p['target']}: must be >= 1")


def _check_overlong(p: Mapping[str, Any]) -> None:
    if not 0 < p["buffer"] <= p["max_len"]:
        raise ValueError(f"params.buffer={p['buffer']}: must be in (0, params.max_len={p['max_len']}]")
    if not math.isfinite(p["factor"]):
        raise ValueError(f"params.factor={p['factor']}: must be finite")


def _check_gym(p: Mapping[str, Any]) -> None:
    del p
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ValueError("type='reasoning_gym': needs the reasoning-gym package "
                         "(pip install reasoning-gym==0.1.25)")


def _check_model(p: Mapping[str, Any]) -> None:
    if not Path(str(p["checkpoint"])).exists():
        raise ValueError(f"params.checkpoint={p['checkpoint']!r}: does not exist (a train-rm run dir, an RM "
                         "checkpoint or an HF sequence-classification dir)")
    for key in ("batch_size", "max_len"):
        if p[key] < 1:
            raise ValueError(f"params.{key}={p[key]}: must be >= 1")


def _check_pairwise(p: Mapping[str, Any]) -> None:
    if isinstance(p["judge"], str):
        import_function(p["judge"], "params.judge")
    if p["group_size"] < 2:
        raise ValueError(f"params.group_size={p['group_size']}: must be >= 2")
    if p["mode"] not in ("score", "verdict"):
        raise ValueError(f"params.mode={p['mode']!r}: allowed values are 'score', 'verdict'")


# type name -> built-in reward. Explicit and greppable (STYLE.md principle 15).
BUILTINS: dict[str, Builtin] = {
    "math_answer": Builtin(math_answer, ("answer",), _check_math),
    "exact_answer": Builtin(exact_answer, ("answer",)),
    "format": Builtin(format_reward, (), _check_format),
    "length": Builtin(length_penalty, ("completion_length",), _check_length),
    "overlong": Builtin(overlong_penalty, ("completion_length",), _check_overlong),
    "countdown": Builtin(countdown, ("numbers", "target")),
    "reasoning_gym": Builtin(reasoning_gym_score, ("answer", "task", "metadata"), _check_gym),
    # params: {checkpoint: RM run dir / HF SequenceClassification dir}
    "model": Builtin(model_reward, (), _check_model),
    # params: {judge: "module:function", group_size: G}
    "pairwise": Builtin(pairwise_reward, (), _check_pairwise),
}
