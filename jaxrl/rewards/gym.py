"""The `reasoning_gym` reward: each reasoning-gym task scores answers with its own `score_answer`.

The model's answer is the content of the last `<answer>...</answer>` tag, else the whole stripped completion.
The record needs the `task` and JSON `metadata` fields that `jaxrl.data` keeps for `reasoning_gym:<task>`.
"""

from __future__ import annotations

import functools
import json

from jaxrl.rewards.answers import _ANSWER_TAG


@functools.cache
def _scorer(task: str):
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def reasoning_gym_score(
    prompts: list[str], completions: list[str], *, answer: list, task: list, metadata: list
) -> list[float]:
    """reasoning-gym's own score in [0, 1] for each completion (partial credit as the task defines it)."""
    del prompts
    out = []
    for completion, ref, name, meta in zip(completions, answer, task, metadata, strict=True):
        tags = _ANSWER_TAG.findall(completion)
        given = tags[-1].strip() if tags else completion.strip()
        out.append(float(_scorer(name)(given, {"answer": ref, "metadata": json.loads(meta)})))
    return out
