"""Reward functions and scoring.

Built-in verifiers (math / exact answer, format, length, overlong, countdown, reasoning-gym, reward model,
pairwise judge: a function or an OpenRS judge model; Proxy-GRM; EVPV-gated PRM steps, docs/rewards.md) and
user functions given as "module:function" — `function:` rewards import and run user code.
Setup calls `resolve(specs)` once (every spec validated before any model is built); each step calls
`score(resolved, prompts, completions, fields)`, which returns a `[B, R]` float32 matrix and a `ScoreInfo`,
and `RewardFailureTracker.update(info)`, which stops a run whose reward fails on every sample.
"""

from jaxrl.rewards.answers import (
    MathVerifyMissing,
    exact_answer,
    extract_answer,
    math_answer,
    math_equal,
    normalize,
    parse_number,
)
from jaxrl.rewards.countdown import countdown, countdown_correct, evaluate
from jaxrl.rewards.failures import RewardError, RewardFailureTracker
from jaxrl.rewards.gym import reasoning_gym_score
from jaxrl.rewards.imports import import_function
from jaxrl.rewards.registry import BUILTINS, Builtin
from jaxrl.rewards.specs import Reward, Rewards, build_reward, resolve
from jaxrl.rewards.rows import score_rows
from jaxrl.rewards.score import RewardFn, ScoreInfo, score
from jaxrl.rewards.shaping import format_reward, length_penalty, overlong_penalty

__all__ = [
    "BUILTINS",
    "Builtin",
    "MathVerifyMissing",
    "Reward",
    "RewardError",
    "RewardFailureTracker",
    "RewardFn",
    "Rewards",
    "ScoreInfo",
    "build_reward",
    "countdown",
    "countdown_correct",
    "evaluate",
    "exact_answer",
    "extract_answer",
    "format_reward",
    "import_function",
    "length_penalty",
    "math_answer",
    "math_equal",
    "normalize",
    "overlong_penalty",
    "parse_number",
    "reasoning_gym_score",
    "resolve",
    "score",
    "score_rows",
]
