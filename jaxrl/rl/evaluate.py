"""Held-out evaluation: greedy accuracy, and avg@k / unbiased pass@k over k sampled completions per prompt.

    greedy:  eval/accuracy       = share of prompts whose greedy completion has full marks (>= 1) on the first
                                   reward
             eval/reward/<r>/mean = mean of each reward over the greedy completions
    k > 1:   eval/avg@k          = mean over prompts of the mean first-reward correctness of k samples
             eval/pass@j         = unbiased pass@j (Chen et al. 2021, arXiv:2107.03374, `losses.pass_at_k`) for
                                   j in {1, k} (and the powers of two in between)

Used by the train loop's eval hook and by `jaxrl eval`. Correct means full marks on the first reward (the first
reward of a config is its task reward): a score >= 1, what every built-in task reward gives a right answer.
Partial credit is not correct: reasoning-gym's scorers give len(ref) / len(answer) to an answer that merely
contains the reference (a whole worked solution with the number somewhere in it), countdown gives its
`format_score` to a parsable wrong expression; "> 0" counted both as right.
"""

from __future__ import annotations

import numpy as np

from jaxrl import losses
from jaxrl.data.pipeline import eval_batches
from jaxrl.runtime.progress import tracked
from jaxrl.sampling import SamplingSpec


def correct(r_B: np.ndarray) -> np.ndarray:
    """bool [B]: full marks on the task reward (>= 1; NaN, a reward that did not score the row, is wrong)."""
    return np.nan_to_num(np.asarray(r_B, np.float64), nan=0.0) >= 1.0


def pass_ks(k: int) -> list[int]:
    """The j of pass@j reported for k samples: 1, 2, 4, ... below k, and k."""
    out, j = [], 1
    while j < k:
        out.append(j)
        j *= 2
    return [*out, k]


def evaluate(collect, params, records, encoder, spec: SamplingSpec, *, batch_size: int,
             sampled: SamplingSpec | None = None, seed: int = 0) -> dict[str, float]:
    """Scores the held-out `records` greedily with `spec` and, when `sampled` (k = num_samples > 1) is given,
    with k samples per prompt.

    Args:
      collect: `(params, records, spec, seed) -> Rollout` (a run's `collector` with train=False, or
        `jaxrl.rl.collect.sample_and_score` bound to a model, tokenizer and rewards).

    Returns:
      {"eval/accuracy", "eval/reward/<name>/mean", and with `sampled` "eval/avg@k", "eval/pass@j"}.
    """
    scores, names = [], ()
    batches = eval_batches(records, encoder, max(batch_size, 1))
    for batch in tracked(batches, "evaluation (greedy)", unit="batches"):
        ro = collect(params, batch, spec, 0)
        scores.append(ro.rewards_BR)
        names = ro.reward_names
    r_BR = np.concatenate(scores)
    out = {f"eval/reward/{name}/mean": float(np.nanmean(r_BR[:, k])) for k, name in enumerate(names)}
    out["eval/accuracy"] = float(np.mean(correct(r_BR[:, 0])))
    if sampled is not None and sampled.num_samples > 1:
        k = sampled.num_samples
        right = []
        for i, batch in enumerate(tracked(batches, f"evaluation ({k} samples)", unit="batches")):
            ro = collect(params, batch, sampled, seed + i)
            right.append(correct(ro.rewards_BR[:, 0]).reshape(-1, k))
        c_PK = np.concatenate(right).astype(np.float64)
        out[f"eval/avg@{k}"] = losses.avg_at_k(c_PK)
        n_P, c_P = np.full(c_PK.shape[0], k), c_PK.sum(axis=1).astype(np.int64)
        for j in pass_ks(k):
            out[f"eval/pass@{j}"] = losses.pass_at_k(n_P, c_P, j)
    return out
