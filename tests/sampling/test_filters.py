"""Token-choice filters against float64 numpy references, and the sampled distribution by chi-square."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxrl.sampling import filters
from sampling_refs import chi2_pvalue, ref_probs

LOGITS_V = np.array([2.0, 1.5, 0.3, -0.7, 1.1, -2.0, 0.0, 0.9])


def test_top_k_hand_example():
    z = jnp.array([[1.0, 3.0, 2.0, 0.0]])
    out = np.asarray(filters.apply_top_k(z, 2))
    np.testing.assert_array_equal(out, [[-np.inf, 3.0, 2.0, -np.inf]])
    np.testing.assert_array_equal(np.asarray(filters.apply_top_k(z, 4)), np.asarray(z))


def test_top_p_hand_example():
    # probs 0.5, 0.3, 0.2 (sorted order 0, 1, 2): top_p=0.6 keeps {0, 1}; 0.5 keeps {0}; 0.81 keeps all.
    z = jnp.log(jnp.array([[0.3, 0.5, 0.2]]))
    keep = lambda p: np.isfinite(np.asarray(filters.apply_top_p(z, p)))[0].tolist()
    assert keep(0.6) == [True, True, False]
    assert keep(0.5) == [False, True, False]
    assert keep(0.81) == [True, True, True]
    assert keep(0.01) == [False, True, False]  # the top token always survives


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.7, 3, None), (1.3, None, 0.8),
                                                     (1.0, 5, 0.7)])
def test_filtered_logits_match_numpy(temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    logits_BV = rng.normal(size=(6, 11)) * 2
    z = filters.filtered_logits(jnp.asarray(logits_BV, jnp.float32), jnp.float32(temperature), top_k=top_k,
                                top_p=None if top_p is None else jnp.float32(top_p))
    got = np.asarray(jax.nn.softmax(z, axis=-1), np.float64)
    for b in range(logits_BV.shape[0]):
        np.testing.assert_allclose(got[b], ref_probs(logits_BV[b], temperature, top_k, top_p), atol=1e-6)


def _draw(n, temperature, top_k, top_p, seed=0):
    logits_BV = jnp.broadcast_to(jnp.asarray(LOGITS_V, jnp.float32), (n, LOGITS_V.size))
    keys_B = filters.row_keys(jax.random.key(seed), jnp.int32(3), jnp.arange(n, dtype=jnp.int32))
    tok_B = filters.choose_tokens(logits_BV, keys_B, jnp.float32(temperature), greedy=False, top_k=top_k,
                                  top_p=None if top_p is None else jnp.float32(top_p))
    return np.bincount(np.asarray(tok_B), minlength=LOGITS_V.size)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.6, None, None), (1.0, 3, None),
                                                     (1.0, None, 0.75), (1.4, 4, 0.9)])
def test_sampled_frequencies_match_distribution(temperature, top_k, top_p):
    counts = _draw(20000, temperature, top_k, top_p)
    assert chi2_pvalue(counts, ref_probs(LOGITS_V, temperature, top_k, top_p)) > 1e-3


def test_chi_square_rejects_wrong_distribution():
    # The test above has power: softmax(z) samples are told apart from softmax(z / 1.2).
    counts = _draw(20000, 1.0, None, None)
    wrong = ref_probs(LOGITS_V, 1.2)
    assert stats.chisquare(counts, counts.sum() * wrong).pvalue < 1e-6


def test_row_keys_depend_only_on_row_and_step():
    key = jax.random.key(7)
    a = filters.row_keys(key, jnp.int32(2), jnp.arange(8, dtype=jnp.int32))
    b = filters.row_keys(key, jnp.int32(2), jnp.arange(4, 8, dtype=jnp.int32))
    c = filters.row_keys(key, jnp.int32(3), jnp.arange(8, dtype=jnp.int32))
    np.testing.assert_array_equal(jax.random.key_data(a)[4:], jax.random.key_data(b))
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(c))


def test_greedy_is_argmax():
    logits_BV = jnp.array([[0.1, 0.5, -1.0], [2.0, 1.0, 3.0]])
    tok = filters.choose_tokens(logits_BV, None, jnp.float32(1.0), greedy=True, top_k=None, top_p=None)
    np.testing.assert_array_equal(np.asarray(tok), [1, 2])
