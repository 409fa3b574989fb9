"""OpenRS pair-score aggregation, bidirectional verdict and [READING] group rewards (spec 7c)."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import openrs
from jaxrl.losses.openrs import Criterion


def test_spec_example():
    crit = [Criterion("core", "A", 2), Criterion("important", "B", 1), Criterion("highlight", "A", 1)]
    np.testing.assert_allclose(openrs.pair_score(crit), 9 / (8 + 1e-6), rtol=1e-12)
    np.testing.assert_allclose(openrs.pair_score(crit), 1.125, atol=1e-6)


def test_fatal_veto_zero_drop_ties_and_judge_json():
    assert openrs.pair_score([Criterion("core", "A", 3), Criterion("fatal", "B", 2),
                              Criterion("fatal", "A", 1)]) == -1.0
    # a zero-score fatal item is dropped entirely, so no veto
    np.testing.assert_allclose(openrs.pair_score([Criterion("core", "A", 2), Criterion("fatal", "B", 0)]),
                               10 / (5 + 1e-6))
    # a tie with non-zero score keeps its weight
    np.testing.assert_allclose(openrs.pair_score([Criterion("core", "A", 2), Criterion("important", "S", 3)]),
                               10 / (7 + 1e-6))
    judge_json = [{"type": "核心", "chosen": "B", "score": 1}, {"chosen": "A", "score": 2},
                  {"type": "unknown", "chosen": "A", "score": 5}]
    np.testing.assert_allclose(openrs.pair_score(judge_json), (-5 + 4) / (7 + 1e-6))
    assert openrs.pair_score([{"type": "core", "chosen": "A", "score": "x"}]) == 0.0
    assert openrs.pair_score([{"type": "core", "score": 1}]) == 0.0
    assert openrs.pair_score([Criterion("core", "A", 1)], min_score=1.5) == 0.0
    assert openrs.pair_score([]) == 0.0


def test_bidirectional_verdict_rule():
    s_f = jnp.array([1.0, -1.0, 1.0, 0.0, 0.5])
    s_b = jnp.array([-1.0, 1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(openrs.bidirectional_verdict(s_f, s_b), [1, -1, 0, 0, 1])
    np.testing.assert_array_equal(openrs.bidirectional_verdict(s_f, s_b, min_score=0.8), [1, -1, 0, 0, 0])


def _np_group_rewards(s, mode, mask=None):
    g = s.shape[0]
    out = np.zeros(g)
    for i in range(g):
        vals = []
        for j in range(g):
            if j == i or (mask is not None and not (mask[i, j] and mask[j, i])):
                continue
            if mode == "score":
                vals.append(0.5 * (s[i, j] - s[j, i]))
            else:
                win = s[i, j] > 0 and s[j, i] <= 0
                lose = s[i, j] <= 0 and s[j, i] > 0
                vals.append(1.0 if win else -1.0 if lose else 0.0)
        out[i] = np.mean(vals) if vals else 0.0
    return out


@pytest.mark.parametrize("mode", ["score", "verdict"])
def test_group_rewards_match_reference(mode):
    rng = np.random.default_rng(0)
    s = rng.normal(size=(3, 4, 4))
    mask = rng.random(size=(3, 4, 4)) > 0.2
    got = openrs.pairwise_group_rewards(jnp.asarray(s), mode=mode)
    np.testing.assert_allclose(got, [_np_group_rewards(s[p], mode) for p in range(3)], rtol=1e-6, atol=1e-7)
    got_m = openrs.pairwise_group_rewards(jnp.asarray(s), mode=mode, pair_mask_PGG=jnp.asarray(mask))
    np.testing.assert_allclose(got_m, [_np_group_rewards(s[p], mode, mask[p]) for p in range(3)], rtol=1e-6,
                               atol=1e-7)


def test_group_rewards_hand_example_and_properties():
    # response 0 beats 1 and 2 in both orders; 1 and 2 tie
    quality = [2.0, 1.0, 1.0]
    s = openrs.score_matrix(lambda i, j: quality[i] - quality[j], 3)
    np.testing.assert_allclose(openrs.pairwise_group_rewards(s), [1.0, -0.5, -0.5])
    np.testing.assert_allclose(openrs.pairwise_group_rewards(s, mode="verdict"), [1.0, -0.5, -0.5])
    # score mode is zero-sum over the group; permuting responses permutes rewards
    rng = np.random.default_rng(1)
    s = jnp.asarray(rng.normal(size=(5, 5)), jnp.float32)
    r = openrs.pairwise_group_rewards(s)
    np.testing.assert_allclose(r.sum(), 0.0, atol=1e-6)
    perm = np.array([3, 0, 4, 1, 2])
    np.testing.assert_allclose(openrs.pairwise_group_rewards(s[perm][:, perm]), r[perm], rtol=1e-6, atol=1e-7)


def test_reference_rewards_and_errors():
    np.testing.assert_allclose(openrs.reference_rewards(jnp.array([1.0, -2.0]), jnp.array([-1.0, 2.0])),
                               [1.0, -2.0])
    verdict = openrs.reference_rewards(jnp.array([1.0]), jnp.array([1.0]), mode="verdict")
    np.testing.assert_array_equal(verdict,
                                  [0.0])
    with pytest.raises(ValueError, match="mode='rank'"):
        openrs.pairwise_group_rewards(jnp.zeros((2, 2)), mode="rank")
    with pytest.raises(ValueError, match="group size >= 2"):
        openrs.pairwise_group_rewards(jnp.zeros((1, 1)))


class VariantsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_reference(self):
        rng = np.random.default_rng(2)
        s = rng.normal(size=(2, 3, 3))
        for mode in ("score", "verdict"):
            got = self.variant(lambda x: openrs.pairwise_group_rewards(x, mode=mode))(jnp.asarray(s))
            np.testing.assert_allclose(got, [_np_group_rewards(s[p], mode) for p in range(2)], rtol=1e-6,
                                       atol=1e-7)
