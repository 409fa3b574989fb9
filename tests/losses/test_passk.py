"""Tests for jaxrl.losses.passk: spec algorithms-2 §5 table, exact binomials (Python integers), stability,
and the estimator's defining properties."""

import math

import numpy as np
import pytest

from jaxrl.losses import avg_at_k, pass_at_k, pass_at_k_per_problem


def _exact(n, c, k):
    """1 - C(n-c, k) / C(n, k) with exact integer binomials (float conversion only at the end)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# Spec §5 table, n = 16: c -> pass@{1, 2, 4, 8, 16}.
SPEC = {0: [0, 0, 0, 0, 0], 1: [0.0625, 0.125, 0.25, 0.5, 1], 4: [0.25, 0.45, 0.728022, 0.961538, 1]}


@pytest.mark.parametrize("c", sorted(SPEC))
def test_spec_table(c):
    for k, expected in zip([1, 2, 4, 8, 16], SPEC[c]):
        np.testing.assert_allclose(pass_at_k_per_problem([16], [c], k), [expected], atol=1e-6)


def test_spec_three_problem_set_and_hand_case():
    n, c = [16, 16, 16], [0, 1, 4]
    np.testing.assert_allclose(pass_at_k(n, c, 1), 0.104167, atol=1e-6)
    np.testing.assert_allclose(pass_at_k(n, c, 4), 0.326007, atol=1e-6)
    np.testing.assert_allclose(pass_at_k(n, c, 16), 2 / 3, rtol=1e-12)
    np.testing.assert_allclose(pass_at_k([4], [1], 2), 0.5, rtol=1e-12)  # with replacement: 0.4375
    scores = np.zeros((3, 16))
    for p, cp in enumerate(c):
        scores[p, :cp] = 1.0
    np.testing.assert_allclose(avg_at_k(scores), pass_at_k(n, c, 1), rtol=1e-12)  # avg@n = pass@1


def test_matches_exact_binomials_on_random_counts():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 60, size=200)
    c = np.array([rng.integers(0, m + 1) for m in n])
    for k in (1, 2, 5, 13):
        ok = n >= k
        got = pass_at_k_per_problem(n[ok], c[ok], k)
        ref = [_exact(int(a), int(b), k) for a, b in zip(n[ok], c[ok])]
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)


def test_stable_where_binomials_overflow_float64():
    got = pass_at_k_per_problem([1024, 4096], [3, 1], 512)
    np.testing.assert_allclose(got[0], 0.875367, atol=1e-6)  # spec: product form
    np.testing.assert_allclose(got[0], _exact(1024, 3, 512), rtol=1e-12)
    np.testing.assert_allclose(got[1], 512 / 4096, rtol=1e-12)  # c = 1: pass@k = k/n
    with pytest.raises(OverflowError):
        float(math.comb(2048, 1024))


def test_properties_and_mixed_sample_counts():
    np.testing.assert_allclose(pass_at_k_per_problem([7, 9, 3], [2, 0, 3], 1), [2 / 7, 0, 1])  # pass@1 = c/n
    np.testing.assert_array_equal(pass_at_k_per_problem([5, 5, 5], [0, 1, 5], 5), [0.0, 1.0, 1.0])
    per = pass_at_k_per_problem([10] * 5, [3] * 5, 4)
    assert np.all(np.diff([pass_at_k([10], [3], k) for k in range(1, 11)]) >= 0)  # monotone in k
    # unbiased pass@k exceeds the biased-low with-replacement form 1 - (1 - c/n)^k
    assert per[0] > 1 - (1 - 0.3) ** 4
    assert pass_at_k([], [], 3) == 0.0 and avg_at_k(np.zeros((0, 4))) == 0.0


def test_avg_at_k_graded_scores():
    scores = np.array([[1.0, 0.5, 0.0, 0.0], [0.25, 0.25, 1.0, 1.0]])
    np.testing.assert_allclose(avg_at_k(scores), (1.5 / 4 + 2.5 / 4) / 2, rtol=1e-12)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="k=5 exceeds the number of samples"):
        pass_at_k([4, 8], [1, 2], 5)
    with pytest.raises(ValueError, match="num_correct exceeds num_samples"):
        pass_at_k([4], [5], 1)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        pass_at_k([4], [1], 0)
    with pytest.raises(ValueError, match="non-negative integers"):
        pass_at_k([4.5], [1], 1)
    with pytest.raises(ValueError, match="differ in shape"):
        pass_at_k([4, 4], [1], 1)
    with pytest.raises(ValueError, match="must be finite"):
        avg_at_k([[1.0, np.nan]])
    with pytest.raises(ValueError, match=r"\[P, k\]"):
        avg_at_k([1.0, 0.0])
