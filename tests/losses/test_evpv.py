"""EVPV-PRM gating and Best-of-N aggregators (spec 7e)."""

import math

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses.research import evpv


def _py_aggregators(scores):
    """Plain-Python float64 reading of the five aggregators, one response at a time."""
    n = len(scores)
    if n == 0:
        return dict.fromkeys(evpv.AGGREGATORS, 0.0)
    w = n * (n + 1) / 2
    total, streak = 0.0, 0
    for s in scores:
        if s == 1:
            streak += 1
            total += streak
        else:
            streak = 0
            total -= 1
    first = next((i / n for i, s in enumerate(scores) if s == -1), 1.0)
    return {
        "correctness_rate": sum(s == 1 for s in scores) / n,
        "position_weighted": (sum(s * (i + 1) for i, s in enumerate(scores)) + w) / (2 * w),
        "streak": (total + n) / (w + n),
        "geometric_mean": math.prod(1.0 if s == 1 else 0.1 for s in scores) ** (1 / n),
        "first_error": first,
    }


def test_spec_example():
    r = jnp.array([1.0, 1.0, -1.0, 1.0])
    visual = jnp.array([True, False, False, True])
    np.testing.assert_allclose(evpv.gate_step_rewards(r, visual, jnp.float32(0.6)), [0.6, 1.0, -1.0, 0.6],
                               rtol=1e-6)
    np.testing.assert_allclose(evpv.correctness_rate(r), 0.75)
    np.testing.assert_allclose(evpv.position_weighted(r), 0.7, rtol=1e-6)
    np.testing.assert_allclose(evpv.geometric_mean(r), 0.5623, atol=5e-5)
    np.testing.assert_allclose(evpv.first_error_position(r), 0.5)
    np.testing.assert_allclose(evpv.streak_score(r), (3 + 4) / (10 + 4), rtol=1e-6)


def test_premise_reliability_rule():
    p = evpv.premise_reliability(jnp.array([0, 1, 0, 1, 3]), jnp.array([0, 0, 2, 1, 0]))
    np.testing.assert_allclose(p,
                               [1.0, 0.5, 0.6, 0.3, 0.0], rtol=1e-6)


def test_gate_does_not_soften_errors_and_sanitises_p():
    r = jnp.array([[1.0, -1.0, 1.0], [1.0, 1.0, -1.0]])
    visual = jnp.ones((2, 3), bool)
    p = jnp.array([jnp.nan, 0.5])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    np.testing.assert_allclose(evpv.gate_step_rewards(r, visual, p, mask),
                               [[0.0, -1.0, 0.0], [0.5, 0.5, 0.0]])
    np.testing.assert_allclose(evpv.gate_step_rewards(r, visual, jnp.array([1.5, 1.0])),
                               [[0, -1, 0], [1, 1, -1]])


def _random_batch(seed, b=6, t=7):
    rng = np.random.default_rng(seed)
    s = rng.choice([1.0, -1.0, 0.6], size=(b, t), p=[0.6, 0.3, 0.1])
    lengths = rng.integers(0, t + 1, size=b)
    lengths[0], lengths[1] = t, 0
    mask = np.arange(t)[None, :] < lengths[:, None]
    return s, mask, lengths


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(evpv.AGGREGATORS))
def test_batched_aggregators_match_python_reference(seed, name):
    s, mask, lengths = _random_batch(seed)
    got = evpv.AGGREGATORS[name](jnp.asarray(s, jnp.float32), jnp.asarray(mask))
    want = [_py_aggregators(list(s[i, : lengths[i]]))[name] for i in range(len(s))]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # padding values never leak in
    noisy = np.where(mask, s, -1.0)
    again = evpv.AGGREGATORS[name](jnp.asarray(noisy, jnp.float32), jnp.asarray(mask))
    np.testing.assert_allclose(again, got)


def test_aggregators_read_gated_values_literally():
    gated = jnp.array([0.6, 1.0, -1.0, 0.6])
    np.testing.assert_allclose(evpv.correctness_rate(gated), 0.25)
    np.testing.assert_allclose(evpv.first_error_position(gated), 0.5)
    np.testing.assert_allclose(evpv.position_weighted(gated), (0.6 + 2 - 3 + 2.4 + 10) / 20, rtol=1e-6)


class VariantsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_reference(self):
        s, mask, lengths = _random_batch(5)
        fn = self.variant(lambda s, m: jnp.stack([f(s, m) for f in evpv.AGGREGATORS.values()]))
        got = fn(jnp.asarray(s, jnp.float32), jnp.asarray(mask))
        for i in range(len(s)):
            want = list(_py_aggregators(list(s[i, : lengths[i]])).values())
            np.testing.assert_allclose(got[:, i], want, rtol=1e-6, atol=1e-7)
        gate = self.variant(evpv.gate_step_rewards)
        got = gate(jnp.array([[1.0, -1.0]]), jnp.array([[True, True]]), jnp.array([0.2]))
        np.testing.assert_allclose(got,
                                   [[0.2, -1.0]], rtol=1e-6)
