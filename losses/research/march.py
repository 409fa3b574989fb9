"""MARCH fact-check reward: checker votes per proposer question, turned into a penalty for the Solver.

MARCH, "Multi-Agent Reinforced self-Check for Hallucination", arXiv:2603.24579 (reference:
Qwen-Applications/MARCH, ``quarl/quarl/trainer/ray_trainer_with_fact_check_march.py``: ``_check_ans_eq``,
``generate_fact_check_batch``, ``fit``).

The Checker answers each proposer question q from the documents S = 3 times; v_{s,q} = +1 if its answer
matches the Proposer's answer, −1 otherwise (also −1 when missing)::

    c_q   = Σ_s v_{s,q}
    fault = #{q : c_q < 0}
    ZTR (default):  r_fc = −1 if fault > 0 else 0
    error rate:     r_fc = −0.1 · min(fault, 13)
    not labelled for fact-checking: r_fc = 0;  labelled but unparsable: r_fc = −1.5;  no QA pairs: r_fc = 0

The Solver's reward is R = r_RM + r_fc; the Checker gets the Solver's r_fc.

Deviations from the reference:
- Batched: ``votes_BSQ`` with a ``question_mask_BQ`` for responses with different numbers of questions;
  a ``[S, Q]`` matrix gives a scalar.
- Reward placement (the reference writes the Checker's reward at index T−1 of the padded tensor) is the
  trainer's business; put it at L_i − 1.
"""

import chex
import jax
import jax.numpy as jnp

_MODES = ("ztr", "error_rate")
_STRIP_CHARS = ("%", "k", "K", "w", "W", ",")


def answers_match(checker_answer: str | None, proposer_answer: str | None) -> bool:
    """Reference answer rule: drop ``% k K w W ,``; equal strings match; else compare as numbers.

    Integers (no ".") must be equal; if either side has a "." they match when |Δ| < 0.1. Anything unparsable
    or missing does not match.
    """
    if checker_answer is None or proposer_answer is None:
        return False
    a, b = checker_answer, proposer_answer
    for ch in _STRIP_CHARS:
        a, b = a.replace(ch, ""), b.replace(ch, "")
    if a == b:
        return True
    try:
        num_a = float(a) if "." in a else int(a)
        num_b = float(b) if "." in b else int(b)
    except ValueError:
        return False
    if isinstance(num_a, int) and isinstance(num_b, int):
        return num_a == num_b
    return abs(float(num_a) - float(num_b)) < 0.1


def checker_votes(checker_answers: list[list[str | None]], proposer_answers: list[str]) -> list[list[int]]:
    """v[s][q] = +1 if checker sample s answered question q like the proposer, else −1 (missing → −1)."""
    votes = []
    for sample in checker_answers:
        padded = list(sample) + [None] * (len(proposer_answers) - len(sample))
        votes.append([1 if answers_match(c, p) else -1 for c, p in zip(padded, proposer_answers)])
    return votes


def fact_check_reward(
    votes_BSQ: jax.Array,
    question_mask_BQ: jax.Array | None = None,
    *,
    mode: str = "ztr",
    labelled_B: jax.Array | None = None,
    parsed_B: jax.Array | None = None,
    max_faults: int = 13,
    fault_coef: float = 0.1,
    unparsable_reward: float = -1.5,
) -> jax.Array:
    """r_fc per response from checker votes ``[B, S, Q]`` (or one ``[S, Q]`` matrix → scalar).

    Args:
      votes_BSQ: ±1 votes (checker sample s, question q).
      question_mask_BQ: 1 for real questions; padded questions are ignored (no question → reward 0).
      mode: "ztr" (zero tolerance, default) or "error_rate".
      labelled_B: samples without fact-check labels get 0. parsed_B: labelled but unparsable → −1.5.
    """
    if mode not in _MODES:
        raise ValueError(f"fact_check_reward mode={mode!r}; allowed: {_MODES}")
    if votes_BSQ.ndim == 2:
        qm = None if question_mask_BQ is None else question_mask_BQ[None]
        lab = None if labelled_B is None else jnp.reshape(labelled_B, (1,))
        par = None if parsed_B is None else jnp.reshape(parsed_B, (1,))
        return fact_check_reward(votes_BSQ[None], qm, mode=mode, labelled_B=lab, parsed_B=par,
                                 max_faults=max_faults, fault_coef=fault_coef,
                                 unparsable_reward=unparsable_reward)[0]
    chex.assert_rank(votes_BSQ, 3)
    b, _, q = votes_BSQ.shape
    qmask_BQ = jnp.ones((b, q), bool) if question_mask_BQ is None else question_mask_BQ.astype(bool)
    chex.assert_shape(qmask_BQ, (b, q))
    c_BQ = votes_BSQ.astype(jnp.float32).sum(1)
    fault_B = (qmask_BQ & (c_BQ < 0)).sum(-1)
    if mode == "ztr":
        r_B = jnp.where(fault_B > 0, -1.0, 0.0)
    else:
        r_B = -fault_coef * jnp.minimum(fault_B, max_faults).astype(jnp.float32)
    if parsed_B is not None:
        r_B = jnp.where(parsed_B.astype(bool), r_B, unparsable_reward)
    if labelled_B is not None:
        r_B = jnp.where(labelled_B.astype(bool), r_B, 0.0)
    return r_B
