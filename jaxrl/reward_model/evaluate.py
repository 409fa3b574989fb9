"""Reward-model evaluation: pairwise accuracy and, per bias attribute, margin/attribute dependence.

For pairs i with score margin m_i = r(chosen_i) − r(rejected_i) and binary attribute a_i (1 = chosen has more
of the attribute):
  accuracy       mean_i 1[m_i > 0]
  correlation    Pearson corr(m, a) (the point-biserial correlation); 0 when a is constant
  mi_nats        plug-in mutual information Î(M_b; A) = Σ_{b,a} p̂(b,a) log p̂(b,a)/(p̂(b)p̂(a)) in nats, with
                 M_b the margin binned into `bins` equal-frequency (quantile) bins. Biased upwards by about
                 (bins − 1)/(2N) nats for independent variables (Miller–Madow), reported as `mi_bias_floor`.
  accuracy_a1 / accuracy_a0   accuracy on pairs with a = 1 / a = 0 (a biased RM is right on one, wrong on
  the other)
Run it on a held-out set where each attribute is balanced (fraction of a = 1 near 0.5, reported as `a_rate`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl.reward_model.data import PairArrays


def score_tokens(model, tokens_BL: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Scores r_B (float32 numpy) of right- or left-padded token rows, in jitted batches of `batch_size`."""
    graphdef, state = nnx.split(model)
    fn = _scorer(graphdef)
    out = []
    for start in range(0, len(tokens_BL), batch_size):
        chunk = tokens_BL[start:start + batch_size]
        pad = batch_size - len(chunk)
        if pad:  # keep one compiled shape: pad the last chunk with copies of its first row
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], pad, axis=0)])
        out.append(np.asarray(fn(state, jnp.asarray(chunk)))[:batch_size - pad])
    return np.concatenate(out) if out else np.zeros((0,), np.float32)


@functools.lru_cache(maxsize=8)
def _scorer(graphdef):
    @jax.jit
    def fn(state, tokens_BL):
        return nnx.merge(graphdef, state)(tokens_BL)[0]
    return fn


def plugin_mi(margin_N: np.ndarray, a_N: np.ndarray, bins: int = 8) -> float:
    """Plug-in MI (nats) between equal-frequency bins of `margin_N` and the discrete `a_N`."""
    margin_N, a_N = np.asarray(margin_N, np.float64), np.asarray(a_N)
    n = len(margin_N)
    if n == 0:
        return 0.0
    ranks = np.argsort(np.argsort(margin_N, kind="stable"), kind="stable")
    b_N = (ranks * bins) // n
    joint = np.zeros((bins, int(a_N.max()) + 1))
    np.add.at(joint, (b_N, a_N), 1.0)
    joint /= n
    outer = joint.sum(1, keepdims=True) * joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log(joint[nz] / outer[nz])).sum())


def pearson(x_N: np.ndarray, y_N: np.ndarray) -> float:
    """Pearson correlation in float64; 0.0 when either side is constant."""
    x, y = np.asarray(x_N, np.float64), np.asarray(y_N, np.float64)
    x, y = x - x.mean(), y - y.mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denom) if denom > 0 else 0.0


def margin_report(margin_N: np.ndarray, attributes: dict[str, np.ndarray], bins: int = 8) -> dict[str, Any]:
    """Accuracy and the per-attribute statistics of the module docstring."""
    margin_N = np.asarray(margin_N, np.float64)
    correct = margin_N > 0
    out: dict[str, Any] = {"num_pairs": int(len(margin_N)), "accuracy": float(correct.mean()),
                           "margin_mean": float(margin_N.mean()), "margin_std": float(margin_N.std()),
                           "attributes": {}}
    for name, a_N in attributes.items():
        a_N = np.asarray(a_N)
        stats = {"a_rate": float(a_N.mean()), "correlation": pearson(margin_N, a_N),
                 "mi_nats": plugin_mi(margin_N, a_N, bins), "mi_bias_floor": (bins - 1) / (2 * len(a_N))}
        for v in (0, 1):
            sel = a_N == v
            stats[f"accuracy_a{v}"] = float(correct[sel].mean()) if sel.any() else None
        out["attributes"][name] = stats
    return out


def evaluate_pairs(model, pairs: PairArrays, batch_size: int = 64, bins: int = 8) -> dict[str, Any]:
    """`margin_report` of `model` on encoded pairs (all three attributes)."""
    r_c = score_tokens(model, pairs.chosen_BL, batch_size)
    r_r = score_tokens(model, pairs.rejected_BL, batch_size)
    report = margin_report(r_c - r_r, pairs.attributes, bins)
    report["dropped_too_long"] = pairs.dropped
    return report
