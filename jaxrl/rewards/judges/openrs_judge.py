"""The `pairwise` reward type: OpenRS pairwise rubric judging, by a local model or a user judge function.

OpenRS (arXiv:2602.14069; reference Qwen-Applications/OpenRS, `tools.py::parse_json_result`,
`tools.py::parse_pair_score`, `evaluator.py::evaluate_pair`). Within each group of G completions of one prompt
(rows contiguous) every ordered pair (i, j), i ≠ j, is judged with A = completion i and B = completion j, so
each unordered pair is judged in both orders. With a judge *model* (`judge: {model: PATH, ...}` or `judge:
{generate: "module:function"}`, see `jaxrl.rewards.judges.local_judge`), all P·G·(G−1) rubric requests of a step are
generated in batches; each reply is parsed and scored::

    the last ```json fenced block of the reply (else the last JSON object in it) → {"rubric_compares": [...]}
    S[p, i, j] = jaxrl.losses.openrs.pair_score(rubric_compares)        (veto / 5-2-1 weights; malformed → 0)
    unparsable reply, or no rubric_compares → S = 0 (as the reference's parse_pair_score)
    R_pi = jaxrl.losses.openrs.pairwise_group_rewards(S, mode)          (mode "score" or "verdict"; [READING])

A request that does not fit the judge's context (its reply is None) leaves that pair out of the means; the
samples of a group with no judged pair fail (None: their `on_error`, counted by the reward-failure guard).
With a judge *function* (`judge: "module:function"`, `judge(prompt, a, b) -> S`) the scores come from it
instead (`jaxrl.rewards.judges.model_reward.pairwise_reward`).

Deviations from the reference: the rubric request is this module's short English prompt (`RUBRIC_REQUEST`; the
reference has 50+ Chinese category prompts), or the user's `prompt_template`; a reply with no fenced block
is read by `json.JSONDecoder.raw_decode` as its last top-level JSON object (the reference's json5 /
json_repair fallbacks are not used); greedy decoding is deterministic, so the reference's five retries on an
unparsable reply are not made.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxrl.rewards.judges.local_judge import Generator, text_generator
from jaxrl.rewards.judges.model_reward import check_groups, group_win_rates
from jaxrl.rewards.judges.model_reward import pairwise_reward as function_pairwise_reward

RUBRIC_REQUEST = (
    "Compare two responses to the same user request. First write 3 to 8 evaluation criteria fitted to the "
    "request and to how the responses differ. Give each criterion a type: core (decisive), important, "
    "highlight (a welcome extra) or fatal (a flaw that alone decides). Then judge each criterion: chosen is "
    "A, B or tie, and score is the margin, an integer from 0 (no difference) to 3.\n"
    "Reply with one JSON block:\n"
    '```json\n{"rubric_compares": [{"criterion": "...", "type": "core", "chosen": "A", "score": 2}]}\n```\n\n'
    "[User request]\n{query}\n\n[Response A]\n{response_a}\n\n[Response B]\n{response_b}\n"
)
_FENCE = re.compile(r"```json\s*(.*?)\s*```", re.DOTALL)


def fill(template: str, **values: str) -> str:
    """`template` with each `{name}` of `values` replaced in one pass (other braces, as in a JSON example,
    stay; a placeholder written inside a value is not expanded)."""
    names = "|".join(map(re.escape, values))
    return re.sub(r"\{(" + names + r")\}", lambda m: values[m.group(1)], template)


def rubric_request(template: str, query: str, response_a: str, response_b: str) -> str:
    """The judge's request: `template` with {query}, {response_a}, {response_b} filled in."""
    return fill(template, query=query, response_a=response_a, response_b=response_b)


def parse_judgement(text: str | None) -> dict | None:
    """The judge's JSON object: the last ```json block, else the last top-level decodable `{...}`; None if
    neither."""
    if not text:
        return None
    blocks = _FENCE.findall(text)
    if blocks:
        try:
            value = json.loads(blocks[-1])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    decoder, found, start = json.JSONDecoder(), None, text.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        found = value if isinstance(value, dict) else found
        start = text.find("{", end)
    return found


def judgement_score(text: str | None) -> float:
    """S of one reply (positive: A better); 0 when it cannot be parsed (reference `parse_pair_score`)."""
    from jaxrl.losses.openrs import pair_score

    result = parse_judgement(text)
    if result is None or not isinstance(result.get("rubric_compares"), list):
        return 0.0
    return float(pair_score(result["rubric_compares"]))


def generated_pairwise_reward(prompts: Sequence[str], completions: Sequence[str], *, generate: Generator,
                              group_size: int, mode: str = "score", min_score: float = 0.0,
                              prompt_template: str = RUBRIC_REQUEST) -> list[float | None]:
    """Per-sample rewards from a text judge: all ordered pairs of every group in one `generate` call."""
    check_groups(prompts, group_size)
    num_prompts = len(completions) // group_size
    pairs = [(p, i, j) for p in range(num_prompts) for i in range(group_size) for j in range(group_size)
             if i != j]
    requests = [rubric_request(prompt_template, prompts[p * group_size],
                               completions[p * group_size + i], completions[p * group_size + j])
                for p, i, j in pairs]
    replies = list(generate(requests))
    if len(replies) != len(requests):
        raise ValueError(f"pairwise judge: {len(replies)} replies for {len(requests)} requests")
    scores = np.zeros((num_prompts, group_size, group_size), np.float32)
    valid = np.zeros(scores.shape, bool)
    for (p, i, j), reply in zip(pairs, replies):
        if reply is not None:
            scores[p, i, j], valid[p, i, j] = judgement_score(reply), True
    return group_win_rates(scores, valid, mode=mode, min_score=min_score)


def pairwise_reward(prompts: list[str], completions: list[str], *,
                    judge: str | Callable[[str, str, str], float] | Mapping[str, Any],
                    group_size: int, mode: str = "score", min_score: float = 0.0,
                    prompt_template: str | None = None) -> list[float | None]:
    """The `pairwise` reward type: a judge model (mapping) or a judge function (see the module docstring).

    Every group of `group_size` rows must share its prompt (`check_groups`), else the call raises."""
    if isinstance(judge, Mapping):
        return generated_pairwise_reward(prompts, completions, generate=text_generator(judge),
                                         group_size=group_size, mode=mode, min_score=min_score,
                                         prompt_template=prompt_template or RUBRIC_REQUEST)
    return function_pairwise_reward(prompts, completions, judge=judge, group_size=group_size, mode=mode,
                                    min_score=min_score)
