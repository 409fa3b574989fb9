"""MARCH fact-check reward (spec 7a)."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses.research import march

EXAMPLE = jnp.array([[1, 1, -1, 1], [1, -1, -1, 1], [1, 1, 1, -1]])


def _np_reward(votes, qmask, mode):
    c = votes.sum(0)
    fault = int(((c < 0) & qmask).sum())
    return (-1.0 if fault > 0 else 0.0) if mode == "ztr" else -0.1 * min(fault, 13)


def test_spec_example():
    np.testing.assert_array_equal(EXAMPLE.sum(0), [3, 1, -1, 1])
    assert float(march.fact_check_reward(EXAMPLE)) == -1.0
    np.testing.assert_allclose(march.fact_check_reward(EXAMPLE, mode="error_rate"), -0.1, rtol=1e-6)


@pytest.mark.parametrize("mode", ["ztr", "error_rate"])
def test_batched_matches_reference_with_question_padding(mode):
    rng = np.random.default_rng(0)
    votes = rng.choice([-1, 1], size=(8, 3, 20), p=[0.6, 0.4])
    nq = rng.integers(0, 21, size=8)
    nq[0] = 0
    qmask = np.arange(20)[None] < nq[:, None]
    got = march.fact_check_reward(jnp.asarray(votes), jnp.asarray(qmask), mode=mode)
    want = [_np_reward(votes[i], qmask[i], mode) for i in range(8)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert float(got[0]) == 0.0  # no QA pairs
    if mode == "error_rate":
        assert float(got.min()) >= -1.3 - 1e-6  # capped at 13 faults


def test_label_and_parse_status():
    votes = jnp.stack([EXAMPLE, EXAMPLE, EXAMPLE])
    r = march.fact_check_reward(votes, labelled_B=jnp.array([1, 0, 1]), parsed_B=jnp.array([1, 1, 0]))
    np.testing.assert_allclose(r, [-1.0, 0.0, -1.5])


def test_answer_match_rule():
    assert march.answers_match("1,000", "1000")
    assert march.answers_match("12%", "12")
    assert march.answers_match("3.14", "3.1")
    assert march.answers_match("3", "3.05")
    assert not march.answers_match("3.2", "3.05")
    assert not march.answers_match("5", "6")
    assert march.answers_match("5.18, 6.30", "5.18, 6.30")
    assert not march.answers_match("Paris", "London")
    assert not march.answers_match(None, "1")
    votes = march.checker_votes([["1", "2"], ["1"], ["0", "2"]], ["1", "2"])
    assert votes == [[1, 1], [1, -1], [-1, 1]]


def test_bad_mode_named():
    with pytest.raises(ValueError, match="mode='strict'"):
        march.fact_check_reward(EXAMPLE, mode="strict")


class VariantsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        votes = jnp.stack([EXAMPLE, -EXAMPLE])
        fn = self.variant(lambda v: march.fact_check_reward(v, mode="error_rate"))
        np.testing.assert_allclose(fn(votes), [-0.1, -0.3], rtol=1e-6)
