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
from jaxrl.rewards.judges.evpv_gate import AGGREGATOR_NAMES, PRM_DEFAULTS, evpv_reward
from jaxrl.rewards.gym import reasoning_gym_score
from jaxrl.rewards.imports import import_function
from jaxrl.rewards.judges.local_judge import check_judge_spec
from jaxrl.rewards.judges.model_reward import model_reward
from jaxrl.rewards.judges.openrs_judge import pairwise_reward
from jaxrl.rewards.judges.proxy_grm import proxy_grm_score
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


def _check_function_or_judge(p: Mapping[str, Any], key: str) -> None:
    if isinstance(p[key], Mapping):
        check_judge_spec(p[key], f"params.{key}")
    elif isinstance(p[key], str):
        import_function(p[key], f"params.{key}")
    elif not callable(p[key]):
        raise ValueError(f"params.{key}={p[key]!r}: must be 'module:function' or a judge model mapping "
                         "{model: PATH, ...}")


def _check_pairwise(p: Mapping[str, Any]) -> None:
    _check_function_or_judge(p, "judge")
    template = p["prompt_template"]
    if template is not None:
        if not isinstance(p["judge"], Mapping):
            raise ValueError("params.prompt_template: only used with a judge model (judge: {model: PATH} or "
                             "{generate: 'module:function'})")
        missing = [k for k in ("{query}", "{response_a}", "{response_b}") if k not in template]
        if missing:
            raise ValueError(f"params.prompt_template: must contain {', '.join(missing)}")
    if p["group_size"] < 2:
        raise ValueError(f"params.group_size={p['group_size']}: must be >= 2")
    if p["mode"] not in ("score", "verdict"):
        raise ValueError(f"params.mode={p['mode']!r}: allowed values are 'score', 'verdict'")


def _check_proxy_grm(p: Mapping[str, Any]) -> None:
    if p["use_fb"] not in range(11):
        raise ValueError(f"params.use_fb={p['use_fb']}: allowed values are 0..10")
    if p["use_proxy"]:
        if p["proxy"] is None:
            raise ValueError("params.proxy: required with use_proxy (a judge model {model: PATH, ...}, "
                             "{generate: 'module:function'} or 'module:function'); or set use_proxy: false")
        _check_function_or_judge(p, "proxy")
    if p["format_pattern"] is not None:
        try:
            re.compile(p["format_pattern"])
        except re.error as e:
            raise ValueError(f"params.format_pattern={p['format_pattern']!r}: not a valid regex "
                             f"({e})") from None
    if not math.isfinite(p["format_weight"]):
        raise ValueError(f"params.format_weight={p['format_weight']}: must be finite")


def _check_evpv(p: Mapping[str, Any]) -> None:
    prm = p["prm"]
    if isinstance(prm, Mapping):
        unknown = sorted(set(prm) - set(PRM_DEFAULTS))
        if unknown or "checkpoint" not in prm:
            raise ValueError(f"params.prm: a reward model is {{checkpoint: PATH, threshold, batch_size, "
                             f"max_len}}; got keys {sorted(prm)}")
        threshold = prm.get("threshold", PRM_DEFAULTS["threshold"])
        number = isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
        if not number or not math.isfinite(threshold):
            raise ValueError(f"params.prm.threshold={threshold!r}: must be a finite number")
        try:
            _check_model({**PRM_DEFAULTS, **prm})
        except ValueError as e:
            raise ValueError(str(e).replace("params.", "params.prm.", 1)) from None
    else:
        _check_function_or_judge(p, "prm")
    if p["premise"] is not None:
        if isinstance(p["premise"], Mapping):
            raise ValueError("params.premise: must be 'module:function'")
        _check_function_or_judge(p, "premise")
    if p["aggregator"] not in AGGREGATOR_NAMES:
        raise ValueError(f"params.aggregator={p['aggregator']!r}: allowed values are "
                         f"{', '.join(map(repr, AGGREGATOR_NAMES))}")
    if not p["step_separator"] or p["max_steps"] < 1:
        raise ValueError("params.step_separator must be non-empty and params.max_steps >= 1")


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
    # params: {judge: "module:function" | {model: PATH, max_new_tokens, ...}, group_size: G, mode}
    "pairwise": Builtin(pairwise_reward, (), _check_pairwise),
    # fields: answer ("1"/"2"), question, response_1, response_2; params: {proxy, use_fb, use_proxy, ...}
    "proxy_grm": Builtin(proxy_grm_score, ("answer", "question", "response_1", "response_2"),
                         _check_proxy_grm),
    # params: {prm: "module:function" | {checkpoint: RM}, premise: "module:function", aggregator}
    "evpv": Builtin(evpv_reward, (), _check_evpv),
}
