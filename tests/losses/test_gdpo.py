"""Tests for jaxrl.losses.gdpo: spec 3 collapse example (GRPO identical, GDPO distinct), spec 7b GD2PO
example, float64 references for both GDPO variants, invariances."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import (gd2po_advantages, gdpo_advantages, gdpo_token_advantages, group_advantages,
                          masked_whiten)


def _np_grpo(r, g, eps):
    r = np.asarray(r, np.float64).reshape(-1, g)
    return ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + eps)).ravel()


def _np_gdpo(r_nk, g, w, eps):
    p = sum(w[k] * _np_grpo(r_nk[:, k], g, eps) for k in range(r_nk.shape[1]))
    return (p - p.mean()) / (p.std(ddof=1) + eps)


def _np_whiten(x, m):
    n = m.sum()
    mu = (x * m).sum() / n
    var = ((x - mu) ** 2 * m).sum() / n * n / (n - 1)
    return (x - mu) / np.sqrt(var + 1e-8)


def test_spec_collapse_example_g2():
    r = jnp.array([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    grpo = np.asarray(group_advantages(r.sum(1), 2, eps=1e-4))
    np.testing.assert_allclose(grpo, [-0.7070, 0.7070, -0.7071, 0.7071], atol=1e-4)
    np.testing.assert_allclose(grpo[:2], grpo[2:], atol=1e-4)  # GRPO: both groups collapse to the same
    gdpo = np.asarray(gdpo_advantages(r, 2, eps=1e-4))
    np.testing.assert_allclose(gdpo, [-0.5477, 0.5477, -1.0954, 1.0954], atol=1e-4)
    assert abs(gdpo[3] - gdpo[1]) > 0.5  # GDPO keeps the combinations apart


def test_spec_collapse_example_g4():
    c1, f1 = [1, 1, 0, 0], [1, 0, 1, 0]
    c2, f2 = [1, 0, 0, 0], [1, 1, 1, 0]
    r = jnp.array(np.stack([c1 + c2, f1 + f2], 1), jnp.float32)
    grpo = np.asarray(group_advantages(r.sum(1), 4, eps=1e-4))
    np.testing.assert_allclose(grpo, [1.2246, 0, 0, -1.2246] * 2, atol=1e-4)
    gdpo = np.asarray(gdpo_advantages(r, 4, eps=1e-4))
    pre = np.array([1.7318, 0, 0, -1.7318, 1.9996, 0, 0, -1.9996])
    np.testing.assert_allclose(gdpo, (pre - pre.mean()) / (pre.std(ddof=1) + 1e-4), atol=1e-4)
    assert not np.allclose(gdpo[:4], gdpo[4:], atol=1e-2)


@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_matches_float64_reference(seed):
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 3, size=(12, 3)).astype(np.float32)
    r[:4, 0] = 1.0  # a reward constant inside a group
    w = np.array([1.0, 0.5, 2.0])
    np.testing.assert_allclose(gdpo_advantages(jnp.asarray(r), 4, weights=w, eps=1e-4),
                               _np_gdpo(r, 4, w, 1e-4), rtol=1e-5, atol=1e-5)


def test_gdpo_all_degenerate_groups_give_zero():
    np.testing.assert_array_equal(gdpo_advantages(jnp.ones((8, 2)), 4), np.zeros(8))


def test_gdpo_token_variant_matches_reference():
    rng = np.random.default_rng(2)
    r = rng.integers(0, 2, size=(8, 2)).astype(np.float32)
    mask = np.arange(5)[None] < rng.integers(1, 6, size=(8, 1))
    got = gdpo_token_advantages(jnp.asarray(r), 4, jnp.asarray(mask))
    p = _np_grpo(r[:, 0], 4, 1e-6) + _np_grpo(r[:, 1], 4, 1e-6)
    x = p[:, None] * mask
    np.testing.assert_allclose(got, _np_whiten(x, mask) * mask, rtol=1e-5, atol=1e-5)


def _spec_7b():
    c = [1, 0, 0, 0, 1, 0, 0, 0]
    length = [0, 0, 1, 1, 1, 0, 0, 0]
    return jnp.array(np.stack([c, length], 1), jnp.float32), jnp.ones((8, 1))


@pytest.mark.parametrize("mode,tau", [("hard", 0.2), ("snr", 0.8)])
def test_spec_gd2po_example_filtered(mode, tau):
    r, mask = _spec_7b()
    adv, metrics = gd2po_advantages(r, 4, mask, mode=mode, tau=tau)
    expected = [0, -0.1571, 0, 0, 1.7646, -0.5358, -0.5358, -0.5358]
    np.testing.assert_allclose(adv[:, 0], expected, atol=1e-4)
    np.testing.assert_allclose(metrics["gd2po/keep_frac"], 5 / 8)
    np.testing.assert_allclose(metrics["gd2po/conflict_frac"], 3 / 8)


def test_spec_gd2po_snr_low_tau_keeps_all_and_equals_gdpo():
    r, mask = _spec_7b()
    adv, _ = gd2po_advantages(r, 4, mask, mode="snr", tau=0.2)
    expected = [0.4399, -0.9480, 0.2540, 0.2540, 2.0818, -0.6939, -0.6939, -0.6939]
    np.testing.assert_allclose(adv[:, 0], expected, atol=1e-4)
    np.testing.assert_allclose(adv, gdpo_token_advantages(r, 4, mask), atol=1e-6)


def test_gd2po_with_lengths_matches_reference():
    rng = np.random.default_rng(3)
    r = rng.integers(0, 2, size=(12, 2)).astype(np.float32)
    mask = np.arange(4)[None] < rng.integers(1, 5, size=(12, 1))
    a = np.stack([_np_grpo(r[:, k], 4, 1e-6) for k in range(2)], 1)
    conflict = (a > 1e-8).any(1) & (a < -1e-8).any(1)
    keep = (~conflict).astype(float)
    rho = np.repeat(keep.reshape(-1, 4).mean(1), 4)
    x = (rho * keep * a.sum(1))[:, None] * mask
    km = keep[:, None] * mask
    ref = _np_whiten(x, km) * km
    got, _ = gd2po_advantages(jnp.asarray(r), 4, jnp.asarray(mask), mode="hard")
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_permuting_within_group_permutes_advantages():
    rng = np.random.default_rng(4)
    r = rng.normal(size=(8, 3)).astype(np.float32)
    perm = np.array([2, 0, 3, 1, 5, 7, 4, 6])
    np.testing.assert_allclose(gdpo_advantages(jnp.asarray(r[perm]), 4),
                               np.asarray(gdpo_advantages(jnp.asarray(r), 4))[perm], rtol=1e-5, atol=1e-6)
    mask = jnp.ones((8, 2))
    a1, _ = gd2po_advantages(jnp.asarray(r[perm]), 4, mask, mode="snr", tau=0.5)
    a0, _ = gd2po_advantages(jnp.asarray(r), 4, mask, mode="snr", tau=0.5)
    np.testing.assert_allclose(a1, np.asarray(a0)[perm], rtol=1e-5, atol=1e-6)


def test_masked_whiten_single_token_is_finite():
    out = masked_whiten(jnp.array([[3.0, 5.0]]), jnp.array([[1, 0]]))
    assert np.all(np.isfinite(out)) and out[0, 0] == 0.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="weights must have shape \\(2,\\)"):
        gdpo_advantages(jnp.zeros((4, 2)), 2, weights=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="mode must be 'hard' or 'snr'"):
        gd2po_advantages(jnp.zeros((4, 2)), 2, jnp.ones((4, 3)), mode="soft")
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        gdpo_advantages(jnp.zeros((5, 2)), 2)


def test_gd2po_eps_snr_enters_the_snr_ratio():
    """s_i = sum_k S_k / (sum_k |S_k| + eps_snr) (spec 7b; 1e-8 tool-calling, 1e-6 safe-alignment scripts).

    Spec 7b's conflicting samples have |s| = 0.268 with sum |S| = 2.366 (L = 1): with tau = 0.2 they are kept
    for eps_snr = 1e-8 and 1e-6, and dropped for eps_snr = 1.0 (|s| = 0.634 / 3.366 = 0.188 < 0.2), which
    gives the hard-filter result."""
    r, mask = _spec_7b()
    keep_all = [0.4399, -0.9480, 0.2540, 0.2540, 2.0818, -0.6939, -0.6939, -0.6939]
    hard = [0, -0.1571, 0, 0, 1.7646, -0.5358, -0.5358, -0.5358]
    for eps_snr, expected in [(1e-8, keep_all), (1e-6, keep_all), (1.0, hard)]:
        adv, m = gd2po_advantages(r, 4, mask, mode="snr", tau=0.2, eps_snr=eps_snr)
        np.testing.assert_allclose(adv[:, 0], expected, atol=1e-4, err_msg=str(eps_snr))
    # the boundary moves with eps_snr exactly as the formula says. Conflicting samples 0, 2, 3 of spec 7b have
    # per-reward advantages (A^c, A^l) = (1.5, -0.866), (-0.5, 0.866), (-0.5, 0.866).
    a_c = np.array([[1.5, -0.8660254], [-0.5, 0.8660254], [-0.5, 0.8660254]])
    for eps_snr in (1e-8, 0.5):
        s_i = np.abs(a_c.sum(1)) / (np.abs(a_c).sum(1) + eps_snr)
        for tau in sorted(set(s_i)):
            for t in (tau - 1e-4, tau + 1e-4):
                n_kept = np.sum(s_i >= t)
                keep = gd2po_advantages(r, 4, mask, mode="snr", tau=t, eps_snr=eps_snr)[1]["gd2po/keep_frac"]
                np.testing.assert_allclose(keep, (5 + n_kept) / 8, err_msg=f"eps_snr={eps_snr}, tau={t}")
    with pytest.raises(ValueError, match="eps_snr must be > 0"):
        gd2po_advantages(r, 4, mask, mode="snr", eps_snr=0.0)


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        r, mask = _spec_7b()
        for fn in (lambda x, m: gdpo_advantages(x, 4), lambda x, m: gdpo_token_advantages(x, 4, m),
                   lambda x, m: gd2po_advantages(x, 4, m, mode="snr", tau=0.8)):
            chex.assert_trees_all_close(self.variant(fn)(r, mask), fn(r, mask), rtol=1e-6, atol=1e-7)


def _flat_and_varied_columns(g: int):
    flat = np.concatenate([np.full(g, 0.7), np.full(g, 1 / 3), np.full(g, 0.1)]).astype(np.float32)
    varied = np.random.default_rng(0).normal(size=3 * g).astype(np.float32)
    return jnp.asarray(np.stack([flat, varied], axis=1))


class EqualRewardColumnTest(chex.TestCase):
    """GDPO per reward: a column whose rewards are all equal within each group (0.7, 1/3: not exact in binary)
    has per-reward advantage exactly 0, so GDPO equals GDPO without that column (to float32 rounding of the
    differently fused sums; the old ±0.056 would show as a difference of that size)."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_equal_column_adds_nothing_sample_form(self):
        from jaxrl.losses.gdpo import _per_reward_advantages

        g = 7
        r_BR = _flat_and_varied_columns(g)
        per_reward = self.variant(lambda r: _per_reward_advantages(r, g, 1e-6))(r_BR)
        np.testing.assert_array_equal(per_reward[:, 0], 0.0)
        both = self.variant(lambda r: gdpo_advantages(r, g, weights=[1.0, 1.0]))(r_BR)
        alone = self.variant(lambda r: gdpo_advantages(r, g, weights=[1.0]))(r_BR[:, 1:])
        np.testing.assert_allclose(both, alone, rtol=1e-6, atol=1e-7)
        flat2 = jnp.stack([r_BR[:, 0], r_BR[:, 0]], 1)
        np.testing.assert_array_equal(self.variant(lambda r: gdpo_advantages(r, g))(flat2), 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_equal_column_adds_nothing_token_form(self):
        g = 7
        r_BR = _flat_and_varied_columns(g)
        mask = jnp.asarray(np.arange(4)[None, :] < np.random.default_rng(1).integers(1, 5, size=(3 * g, 1)))
        tok = self.variant(lambda r, m: gdpo_token_advantages(r, g, m, weights=[1.0, 1.0]))(r_BR, mask)
        tok_alone = self.variant(lambda r, m: gdpo_token_advantages(r, g, m, weights=[1.0]))(r_BR[:, 1:], mask)
        np.testing.assert_allclose(tok, tok_alone, rtol=1e-6, atol=1e-7)
