"""OpenRS pairwise rubric scores and their conversion into per-sample group rewards.

"Open Rubric System, Pairwise Adaptive Meta-Rubrics" (OpenRS), arXiv:2602.14069 (reference:
Qwen-Applications/OpenRS, ``tools.py::parse_pair_score``, ``evaluator.py::evaluate_pair``).

A judge compares responses A and B on criteria c of kind core (w=5) / important (2) / highlight (1) / fatal,
each with a winner (A, B or tie) and an integer margin::

    criteria with score 0 are dropped
    signed_c = +|score_c| (A), −|score_c| (B), 0 (tie; its weight still counts)
    any fatal criterion kept:  S = Σ_{fatal c} signed_c                     (veto: the others are ignored)
    otherwise:                 S = Σ_c w_c signed_c / (Σ_c w_c + 1e-6)     (missing kind → important)
    |S| < min_score → 0;  a malformed criterion → 0
    verdict(S_f, S_b) = +1 if S_f > m and S_b ≤ −m;  −1 if S_f ≤ −m and S_b > m;  else 0   (S_b: A/B swapped)

[READING] RL use (not in the repository; the abstract says "reward supervision in pairwise RL training"). With
S[i, j] the judge's score for A = response i, B = response j within a group of G::

    d_ij = ½ (S[i, j] − S[j, i])      ("score")   or   d_ij = verdict(S[i, j], S[j, i])   ("verdict")
    R_i  = (1 / (G − 1)) Σ_{j ≠ i} d_ij                                           (win-rate style)

Deviations from the reference:
- Criterion kinds are accepted in English (core / important / highlight / fatal) or as the judge's Chinese
  labels (核心 / 重要 / 亮点 / 硬伤); unknown kinds are ignored, as in the reference.
- ``pairwise_group_rewards`` also takes a ``pair_mask`` for judge calls that failed (excluded from the mean).
"""

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

_WEIGHTS = {"core": 5.0, "important": 2.0, "highlight": 1.0, "核心": 5.0, "重要": 2.0, "亮点": 1.0}
_FATAL = ("fatal", "硬伤")
_MODES = ("score", "verdict")


class Criterion(NamedTuple):
    """A judged rubric item: ``kind`` (core/important/highlight/fatal), ``chosen`` (A/B/tie), ``score``."""

    kind: str
    chosen: str
    score: int


def pair_score(criteria: Iterable[Criterion | Mapping], *, min_score: float = 0.0) -> float:
    """Aggregate judged criteria into S (positive: A better).

    Mappings use the judge's JSON keys ``type`` / ``chosen`` / ``score``.
    """
    fatal_sum, has_fatal, weighted, total_w = 0.0, False, 0.0, 0.0
    try:
        for item in criteria:
            if isinstance(item, Mapping):
                item = Criterion(item.get("type", "important"), item["chosen"], item["score"])
            raw = int(item.score)
            if raw == 0:
                continue
            signed = abs(raw) if item.chosen == "A" else -abs(raw) if item.chosen == "B" else 0.0
            if item.kind in _FATAL:
                has_fatal, fatal_sum = True, fatal_sum + signed
            elif item.kind in _WEIGHTS:
                weighted += _WEIGHTS[item.kind] * signed
                total_w += _WEIGHTS[item.kind]
    except (KeyError, TypeError, ValueError, AttributeError):
        return 0.0
    if has_fatal:
        s = float(fatal_sum)
    else:
        s = weighted / (total_w + 1e-6) if total_w else 0.0
    return 0.0 if abs(s) < min_score else s


def bidirectional_verdict(
    s_forward: jax.Array, s_backward: jax.Array, *, min_score: float = 0.0
) -> jax.Array:
    """+1 (first response better), −1 (second better) or 0 (tie) from the forward and swapped scores."""
    s_f, s_b = jnp.asarray(s_forward, jnp.float32), jnp.asarray(s_backward, jnp.float32)
    good = (s_f > min_score) & (s_b <= -min_score)
    bad = (s_f <= -min_score) & (s_b > min_score)
    return jnp.where(good, 1.0, jnp.where(bad, -1.0, 0.0))


def score_matrix(score_fn: Callable[[int, int], float], group_size: int) -> jax.Array:
    """S[i, j] = score_fn(i, j) for i ≠ j (A = i, B = j), 0 on the diagonal.

    Host-side: calls the judge G(G−1) times.
    """
    rows = [[0.0 if i == j else float(score_fn(i, j)) for j in range(group_size)] for i in range(group_size)]
    return jnp.asarray(rows, jnp.float32)


def pairwise_group_rewards(
    scores_PGG: jax.Array,
    *,
    mode: str = "score",
    min_score: float = 0.0,
    pair_mask_PGG: jax.Array | None = None,
) -> jax.Array:
    """[READING] Per-sample rewards R_PG = mean over j ≠ i of d_ij; ``[G, G]`` → ``[G]``.

    Args:
      scores_PGG: S[p, i, j], the judge's score with A = response i and B = response j of prompt p.
      mode: "score" (antisymmetrised margin) or "verdict" (bidirectional ±1/0).
      pair_mask_PGG: 1 where both S[i, j] and S[j, i] are valid; pairs with a failed judge call are skipped.
    """
    if mode not in _MODES:
        raise ValueError(f"pairwise_group_rewards mode={mode!r}; allowed: {_MODES}")
    if scores_PGG.ndim == 2:
        mask = None if pair_mask_PGG is None else pair_mask_PGG[None]
        return pairwise_group_rewards(scores_PGG[None], mode=mode, min_score=min_score, pair_mask_PGG=mask)[0]
    chex.assert_rank(scores_PGG, 3)
    g = scores_PGG.shape[-1]
    chex.assert_axis_dimension(scores_PGG, 1, g)
    if g < 2:
        raise ValueError(f"pairwise_group_rewards needs group size >= 2, got {g}")
    s_PGG = scores_PGG.astype(jnp.float32)
    s_back_PGG = jnp.swapaxes(s_PGG, 1, 2)
    if mode == "score":
        d_PGG = 0.5 * (s_PGG - s_back_PGG)
    else:
        d_PGG = bidirectional_verdict(s_PGG, s_back_PGG, min_score=min_score)
    valid_PGG = jnp.broadcast_to(~jnp.eye(g, dtype=bool), s_PGG.shape)
    if pair_mask_PGG is not None:
        chex.assert_equal_shape([scores_PGG, pair_mask_PGG])
        m = pair_mask_PGG.astype(bool)
        valid_PGG = valid_PGG & m & jnp.swapaxes(m, 1, 2)
    total_PG = jnp.where(valid_PGG, d_PGG, 0.0).sum(-1)
    return total_PG / jnp.maximum(valid_PGG.sum(-1), 1).astype(jnp.float32)


def reference_rewards(
    s_forward_B: jax.Array, s_backward_B: jax.Array, *, mode: str = "score", min_score: float = 0.0
) -> jax.Array:
    """[READING] Reward against a fixed reference answer.

    Forward: A = sample, B = reference; backward: swapped.
    """
    if mode not in _MODES:
        raise ValueError(f"reference_rewards mode={mode!r}; allowed: {_MODES}")
    chex.assert_equal_shape([s_forward_B, s_backward_B])
    if mode == "score":
        return 0.5 * (s_forward_B.astype(jnp.float32) - s_backward_B.astype(jnp.float32))
    return bidirectional_verdict(s_forward_B, s_backward_B, min_score=min_score)

