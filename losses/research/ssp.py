"""SSP (Search Self-Play) reward rules for the Solver and the Proposer.

"Search Self-Play", arXiv:2510.18821 (reference: Alibaba-Quark/SSP, ``quarl/trainer/ppo/ssp_ray_trainer.py``:
``_calculate_self_play_rewards``, ``_compute_proposer_rewards``; ``quarl/reward/score/quark_score.py``).

One policy proposes a question (from a target answer, with search) and n solver rollouts answer it::

    solver     R_s = 1 / (4 if #"<answer>" > 10 or #"</answer>" > 10 else 1)  if correct,  else 0
    proposer   p   = (1/n) Σ_k 1[R_s,k > 0]
               "1-acc" (default):          R_p = 1 − p
               "intermediate_difficulty":  R_p = 4 (left + p)(right − p) if 0 < p < 1 else 0
                                           (defaults: left=0, right=1)
               "format_only":              R_p = 1 (any extracted problem; the solvers' results are ignored)
               extraction failure / dummy problem: R_p = format_penalty (config −1, script 0)

Solver advantages are GRPO over the n samples (``jaxrl.losses.advantages.group_advantages``); a proposer with
group size 1 gets A = R under verl's GRPO.

Deviations from the reference:
- Array functions over ``[P, n]`` solver rewards with an optional mask for prompts with fewer solver samples;
  correctness (EM or LLM judge) is the caller's string work; ``answer_tag_counts`` counts the tags.
- An unknown proposer mode is an error (the reference silently falls back to "1-acc").
"""

from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

_MODES = ("1-acc", "intermediate_difficulty", "format_only")
_OPEN_TAG, _CLOSE_TAG = "<answer>", "</answer>"


def answer_tag_counts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Host-side: (number of "<answer>", number of "</answer>") in each solver response, int32 [B] each.

    Counts non-overlapping substrings, like the reference's ``count_answer_tags`` (``str.count``).
    """
    opens = np.array([t.count(_OPEN_TAG) for t in texts], np.int32)
    closes = np.array([t.count(_CLOSE_TAG) for t in texts], np.int32)
    return opens, closes


def solver_reward(
    correct_B: jax.Array,
    open_tags_B: jax.Array,
    close_tags_B: jax.Array,
    *,
    max_answer_tags: int = 10,
    overuse_divisor: float = 4.0,
) -> jax.Array:
    """R_s = correct / (overuse_divisor if open > max or close > max else 1), float32.

    The reference (``quark_score.py::compute_score``) tests the opening and the closing tag counts separately
    (``open_count > 10 or close_count > 10``), so both are required here.

    Args:
      correct_B: [B] bool/int, 1 if the answer matched (EM or LLM judge).
      open_tags_B, close_tags_B: [B] int counts of "<answer>" and "</answer>" (``answer_tag_counts``).
      max_answer_tags: the reference's 10.  overuse_divisor: the reference's 4.

    Returns:
      [B] float32 rewards.
    """
    chex.assert_equal_shape([correct_B, open_tags_B, close_tags_B])
    overused_B = (open_tags_B > max_answer_tags) | (close_tags_B > max_answer_tags)
    scale_B = jnp.where(overused_B, 1.0 / overuse_divisor, 1.0)
    return jnp.where(correct_B.astype(bool), scale_B, 0.0).astype(jnp.float32)


def proposer_reward(
    solver_rewards_PN: jax.Array,
    *,
    mode: str = "1-acc",
    solver_mask_PN: jax.Array | None = None,
    valid_P: jax.Array | None = None,
    format_penalty: float = -1.0,
    left: float = 0.0,
    right: float = 1.0,
) -> jax.Array:
    """R_p per proposed problem from its solvers' rewards ``[P, n]``.

    Args:
      mode: "1-acc", "intermediate_difficulty" or "format_only" (1 for every valid problem: rewards the
        proposer for producing an extractable problem, the reference's ``reward_type="format_only"``).
      solver_mask_PN: 1 for real solver samples (default all); a problem with none counts as p = 0.
      valid_P: 0 where the problem could not be extracted (or is a dummy) → ``format_penalty``.
    """
    if mode not in _MODES:
        raise ValueError(f"proposer_reward mode={mode!r}; allowed: {_MODES}")
    chex.assert_rank(solver_rewards_PN, 2)
    m_PN = jnp.ones(solver_rewards_PN.shape, bool) if solver_mask_PN is None else solver_mask_PN.astype(bool)
    chex.assert_equal_shape([solver_rewards_PN, m_PN])
    n_P = m_PN.sum(-1).astype(jnp.float32)
    p_P = (m_PN & (solver_rewards_PN > 0)).sum(-1) / jnp.maximum(n_P, 1.0)
    if mode == "1-acc":
        r_P = 1.0 - p_P
    elif mode == "format_only":
        r_P = jnp.ones_like(p_P)
    else:
        r_P = jnp.where((p_P > 0) & (p_P < 1), 4.0 * (left + p_P) * (right - p_P), 0.0)
    if valid_P is not None:
        chex.assert_shape(valid_P, p_P.shape)
        r_P = jnp.where(valid_P.astype(bool), r_P, format_penalty)
    return r_P.astype(jnp.float32)
