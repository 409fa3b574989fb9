"""float64 numpy references shared by the sampling tests."""

import numpy as np
from scipy import stats


def ref_probs(logits_V, temperature=1.0, top_k=None, top_p=None):
    """float64 reference of HF's order: temperature, top-k, then nucleus on the renormalised top-k."""
    z = np.asarray(logits_V, np.float64) / temperature
    keep = np.ones(z.shape, bool)
    if top_k is not None:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    p = np.where(keep, np.exp(z - z.max()), 0.0)
    p /= p.sum()
    if top_p is not None:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        nucleus = np.zeros_like(keep)
        nucleus[order[before < top_p]] = True
        nucleus[order[0]] = True
        p = np.where(nucleus, p, 0.0)
        p /= p.sum()
    return p


def chi2_pvalue(counts, probs):
    support = probs > 0
    assert counts[~support].sum() == 0, f"sampled tokens outside the support: {counts}"
    return stats.chisquare(counts[support], counts.sum() * probs[support]).pvalue
