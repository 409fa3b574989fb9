"""Evaluation metrics over k samples per problem: the unbiased pass@k estimator and avg@k (host-side numpy).

    pass@k(p) = 1 − C(n_p − c_p, k) / C(n_p, k)                             (unbiased for n_p ≥ k)
              = 1                                        if n_p − c_p < k
              = 1 − Π_{j = n_p − c_p + 1}^{n_p} (1 − k/j)  otherwise        (product form: no binomials)
    avg@k     = (1/P) Σ_p (1/k) Σ_{j ≤ k} score_{p,j}                       (verl: mean@k)

Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv:2107.03374 (Codex; reference
`openai/human-eval` `estimate_pass_at_k`). The product follows from
C(n−c, k)/C(n, k) = Π_{j=n−c+1}^{n} (j−k)/j; its factors lie in [0, 1), so it stays exact where the binomials
overflow (C(2048, 1024) > 1e308). It is summed in log space (log1p(−k/j)) to avoid underflow of long
products. Properties: pass@1 = c/n, pass@n = 1[c > 0]. The naive 1 − (1 − c/n)^k (sampling with replacement;
verl's bootstrapped best@k in expectation) is biased low.

Choices: counts are per problem, so problems may have different n_p; k > n_p is an error (the estimator is
undefined), as is c_p > n_p. Binarising scores into "correct" is the caller's rule (state it in reports:
`score >= 1` as slime, or `> 0`).
"""

import numpy as np


def _as_counts(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"pass_at_k: {name} must be a 1-D array of per-problem counts, got {arr.shape}")
    if arr.size and (not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr != np.round(arr))):
        raise ValueError(f"pass_at_k: {name} must hold non-negative integers, got {arr}")
    return arr.astype(np.int64)


def pass_at_k_per_problem(num_samples_P, num_correct_P, k: int) -> np.ndarray:
    """Unbiased pass@k of each problem (module docstring), float64.

    Args:
      num_samples_P: [P] int n_p, samples drawn for problem p (each >= k).
      num_correct_P: [P] int c_p, correct samples among them (0 <= c_p <= n_p).
      k: int >= 1.

    Returns:
      [P] float64 in [0, 1].
    """
    n_P = _as_counts(num_samples_P, "num_samples_P")
    c_P = _as_counts(num_correct_P, "num_correct_P")
    if n_P.shape != c_P.shape:
        raise ValueError(f"pass_at_k: num_samples_P {n_P.shape} and num_correct_P {c_P.shape} differ in "
                         "shape")
    if not (isinstance(k, (int, np.integer)) and k >= 1):
        raise ValueError(f"pass_at_k: k must be an int >= 1, got {k!r}")
    if np.any(c_P > n_P):
        bad = np.flatnonzero(c_P > n_P)
        raise ValueError(f"pass_at_k: num_correct exceeds num_samples for problems {bad}")
    if np.any(n_P < k):
        raise ValueError(f"pass_at_k: k={k} exceeds the number of samples of problems "
                         f"{np.flatnonzero(n_P < k)} "
                         f"(n = {n_P[n_P < k]}); the unbiased estimator needs n >= k")
    out_P = np.ones(n_P.shape, np.float64)
    for p in np.flatnonzero(n_P - c_P >= k):
        j = np.arange(n_P[p] - c_P[p] + 1, n_P[p] + 1, dtype=np.float64)
        out_P[p] = -np.expm1(np.sum(np.log1p(-k / j)))
    return out_P


def pass_at_k(num_samples_P, num_correct_P, k: int) -> float:
    """Mean over problems of the unbiased pass@k (`pass_at_k_per_problem`); 0.0 for no problems."""
    per_P = pass_at_k_per_problem(num_samples_P, num_correct_P, k)
    return float(np.mean(per_P)) if per_P.size else 0.0


def avg_at_k(scores_PK) -> float:
    """avg@k = mean over problems of the mean score of their k samples (verl mean@k), float.

    Args:
      scores_PK: [P, k] float scores (binary or graded), k samples per problem; NaN is an error.

    Returns:
      float; 0.0 for no problems.
    """
    s_PK = np.asarray(scores_PK, np.float64)
    if s_PK.ndim != 2:
        raise ValueError(f"avg_at_k: scores must be [P, k], got shape {s_PK.shape}")
    if not np.all(np.isfinite(s_PK)):
        raise ValueError("avg_at_k: scores must be finite (score unscorable samples explicitly, e.g. 0)")
    return float(np.mean(s_PK)) if s_PK.size else 0.0
