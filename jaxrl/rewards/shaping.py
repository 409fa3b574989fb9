"""Format and length rewards: regex / tag format checks, a linear length penalty and DAPO's overlong penalty
(the same function as `jaxrl.losses.overlong_penalty`, applied to a list of lengths).

Length rewards read the per-sample token count from the `completion_length` field, which the rollout passes
alongside the dataset fields (character counts would silently disagree with the token budget).
"""

from __future__ import annotations

import re

import numpy as np

from jaxrl import losses


def format_reward(
    prompts: list[str],
    completions: list[str],
    *,
    pattern: str | None = None,
    tags: list[str] | tuple[str, ...] = (),
) -> list[float]:
    """1.0 where the completion matches `pattern` (re.fullmatch, DOTALL, after stripping) and contains each of
    `tags` exactly once as `<tag>...</tag>`; else 0.0."""
    del prompts
    if pattern is None and not tags:
        raise ValueError(
            "the format reward needs params.pattern (a regex) and/or params.tags (a list of tag names)"
        )
    regex = re.compile(pattern, re.DOTALL) if pattern is not None else None
    tag_res = [re.compile(rf"<{re.escape(t)}>.*?</{re.escape(t)}>", re.DOTALL) for t in tags]
    out = []
    for text in completions:
        ok = regex is None or regex.fullmatch(text.strip()) is not None
        ok = ok and all(
            len(r.findall(text)) == 1 and text.count(f"<{t}>") == 1 for r, t in zip(tag_res, tags)
        )
        out.append(float(ok))
    return out


def length_penalty(
    prompts: list[str],
    completions: list[str],
    *,
    completion_length: list[int],
    target: int,
    coef: float = 1.0,
) -> list[float]:
    """Linear penalty beyond a target length: r = −coef · max(0, L − target) / target."""
    del prompts, completions
    if target < 1:
        raise ValueError(f"length_penalty: params.target={target} must be >= 1")
    return [-coef * max(0, int(n) - target) / target for n in completion_length]


def overlong_penalty(
    prompts: list[str],
    completions: list[str],
    *,
    completion_length: list[int],
    max_len: int,
    buffer: int,
    factor: float = 1.0,
) -> list[float]:
    """DAPO soft overlong punishment as a reward (arXiv:2503.14476, eq. 13): `jaxrl.losses.overlong_penalty`.

    r = min(−(L − (L_max − L_buf)) / L_buf · κ, 0): 0 up to L_max − L_buf tokens, −κ at L_max, and (as in the
    paper, spec 1.5 and verl's DAPO reward manager) not clamped below past L_max.
    max_len: L_max (the generation budget); buffer: L_buf in (0, L_max]; factor: κ.
    """
    del prompts, completions
    lengths_B = np.asarray(completion_length, np.int64).reshape(-1)
    penalty_B = losses.overlong_penalty(lengths_B, max_length=max_len, buffer=buffer, factor=factor)
    return [float(x) for x in np.asarray(penalty_B)]
