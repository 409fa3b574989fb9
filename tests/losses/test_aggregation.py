"""Tests for jaxrl.losses.aggregation: spec 1.9 numbers, float64 reference, padding and micro-batch
invariances."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import AggMode, aggregate, aggregation_normalizer

MODES = [m.value for m in AggMode]


def _np_aggregate(v, m, mode, horizon=None):
    v, m = np.asarray(v, np.float64), np.asarray(m, np.float64)
    v = np.where(m > 0, v, 0.0)
    lens = m.sum(1)
    nonempty = lens > 0
    if mode == "token-mean":
        return (v * m).sum() / max(m.sum(), 1)
    if mode == "seq-mean-token-mean":
        return np.mean([(v[i] * m[i]).sum() / lens[i] for i in np.flatnonzero(nonempty)])
    if mode == "seq-mean-token-sum":
        return np.mean([(v[i] * m[i]).sum() for i in np.flatnonzero(nonempty)])
    horizon = v.shape[1] if horizon is None else horizon
    return np.mean([(v[i] * m[i]).sum() for i in np.flatnonzero(nonempty)]) / horizon


def _random_batch(seed, b=6, t=7):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(b, t)).astype(np.float32)
    lens = rng.integers(0, t + 1, size=b)
    lens[0], lens[1] = 0, t  # one all-padded row, one full row
    m = (np.arange(t)[None] < lens[:, None])
    v[~m] = np.where(rng.random((~m).sum()) < 0.5, np.nan, 1e30)  # garbage in padding must not leak
    return jnp.asarray(v), jnp.asarray(m)


SPEC_V = jnp.array([[1.0, 1.0, 9.0, 9.0], [0.5, 0.5, 0.5, 0.5]])
SPEC_M = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]])


@pytest.mark.parametrize("mode,expected", [("token-mean", 4 / 6), ("seq-mean-token-mean", 0.75),
                                           ("seq-mean-token-sum", 2.0), ("seq-mean-token-sum-norm", 0.5)])
def test_spec_worked_example(mode, expected):
    np.testing.assert_allclose(aggregate(SPEC_V, SPEC_M, mode), expected, rtol=1e-6)
    np.testing.assert_allclose(aggregate(SPEC_V, SPEC_M, AggMode(mode)), expected, rtol=1e-6)


def test_seq_mean_token_sum_norm_horizon():
    # verl 0.9 semantics: mean over non-empty sequences of token sums (2.0) divided by the horizon.
    got = aggregate(SPEC_V, SPEC_M, "seq-mean-token-sum-norm", horizon=8)
    np.testing.assert_allclose(got, 0.25, rtol=1e-6)
    # The spec's verl-0.6.1 value 4/4 = 1.0 is the same as a normaliser of T (no mean over sequences).
    got = aggregate(SPEC_V, SPEC_M, "seq-mean-token-sum", normalizer=4.0)
    np.testing.assert_allclose(got, 1.0, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_float64_reference(mode, seed):
    v, m = _random_batch(seed)
    got = aggregate(v, m, mode)
    assert np.isfinite(got)
    np.testing.assert_allclose(got, _np_aggregate(v, m, mode), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES[:3])
def test_extra_padding_rows_and_columns_leave_value_unchanged(mode):
    v, m = _random_batch(3)
    v2 = jnp.pad(v, ((0, 2), (0, 3)), constant_values=7.0)
    m2 = jnp.pad(m, ((0, 2), (0, 3)))
    # atol: the value is a near-zero mean, and padding changes the float32 summation order.
    np.testing.assert_allclose(aggregate(v2, m2, mode), aggregate(v, m, mode), rtol=1e-6, atol=1e-7)


def test_sum_norm_with_fixed_horizon_is_padding_invariant():
    v, m = _random_batch(4)
    v2, m2 = jnp.pad(v, ((0, 0), (0, 5))), jnp.pad(m, ((0, 0), (0, 5)))
    np.testing.assert_allclose(aggregate(v2, m2, "seq-mean-token-sum-norm", horizon=16),
                               aggregate(v, m, "seq-mean-token-sum-norm", horizon=16), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_normalizer_sum_to_full_batch(mode):
    v, m = _random_batch(5, b=8)
    full = aggregate(v, m, mode)
    z = aggregation_normalizer(m, mode)
    parts = [aggregate(v[i:i + 2], m[i:i + 2], mode, normalizer=z, horizon=None) for i in range(0, 8, 2)]
    np.testing.assert_allclose(sum(parts), full, rtol=1e-5)
    # Using each micro-batch's own normaliser would not (the test can fail).
    local = sum(aggregate(v[i:i + 2], m[i:i + 2], mode) for i in range(0, 8, 2)) / 4
    assert not np.isclose(local, full, rtol=1e-4)


def test_all_masked_batch_is_zero_with_zero_grads():
    v = jnp.ones((2, 3))
    for mode in MODES:
        val, g = jax.value_and_grad(lambda x: aggregate(x, jnp.zeros((2, 3)), mode))(v)
        assert val == 0.0 and np.all(np.asarray(g) == 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_gradients_finite_with_fully_masked_row(mode):
    v, m = _random_batch(6)
    v = jnp.where(m, v, 0.0)
    g = jax.grad(lambda x: aggregate(x, m, mode))(v)
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[0] == 0.0)
    jax.test_util.check_grads(lambda x: aggregate(x, m, mode), (v,), order=2, modes=["rev"])


def test_unknown_mode_and_shape_errors():
    with pytest.raises(ValueError, match="allowed: 'token-mean'"):
        aggregate(SPEC_V, SPEC_M, "token_mean")
    with pytest.raises(AssertionError):
        aggregate(SPEC_V, SPEC_M[:, :3], "token-mean")


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        v, m = _random_batch(7)
        for mode in MODES:
            np.testing.assert_allclose(self.variant(lambda a, b: aggregate(a, b, mode))(v, m),
                                       aggregate(v, m, mode), rtol=1e-6)
