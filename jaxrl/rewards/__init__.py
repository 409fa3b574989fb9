"""Reward functions: built-in verifiers (math / exact answer, format, length, overlong, countdown), user
functions
given as "module:function", and `score` which turns K reward specs into a `[N, K]` float32 matrix."""

from jaxrl.rewards.answers import (
    exact_answer,
    extract_answer,
    math_answer,
    math_equal,
    normalize,
    parse_number,
)
from jaxrl.rewards.countdown import countdown, countdown_correct, evaluate
from jaxrl.rewards.gym import reasoning_gym_score
from jaxrl.rewards.score import BUILTINS, Reward, RewardFn, ScoreInfo, build_reward, build_rewards, score
from jaxrl.rewards.shaping import format_reward, length_penalty, overlong_penalty

__all__ = [
    "BUILTINS",
    "Reward",
    "RewardFn",
    "ScoreInfo",
    "build_reward",
    "build_rewards",
    "countdown",
    "countdown_correct",
    "evaluate",
    "exact_answer",
    "extract_answer",
    "format_reward",
    "length_penalty",
    "math_answer",
    "math_equal",
    "normalize",
    "overlong_penalty",
    "parse_number",
    "reasoning_gym_score",
    "score",
]
