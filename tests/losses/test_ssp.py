"""SSP solver / proposer rewards (spec 7f)."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses.research import ssp


def _np_grpo(r, eps=1e-6):
    r = np.asarray(r, np.float64)
    return (r - r.mean()) / (r.std(ddof=1) + eps)


def test_spec_example():
    r_s = jnp.array([[1.0, 0.0, 0.0, 1.0, 0.0]])
    np.testing.assert_allclose(ssp.proposer_reward(r_s), [0.6], rtol=1e-6)
    np.testing.assert_allclose(ssp.proposer_reward(r_s, mode="intermediate_difficulty"), [0.96], rtol=1e-6)
    np.testing.assert_allclose(_np_grpo(r_s[0]), [1.0954, -0.7303, -0.7303, 1.0954, -0.7303], atol=1e-4)


def test_spec_example_solver_advantages_with_part_a_if_present():
    adv_mod = pytest.importorskip("jaxrl.losses.advantages")
    if not hasattr(adv_mod, "group_advantages"):
        pytest.skip("group_advantages not there yet")
    adv = adv_mod.group_advantages(jnp.array([1.0, 0.0, 0.0, 1.0, 0.0]), 5)
    np.testing.assert_allclose(adv, [1.0954, -0.7303, -0.7303, 1.0954, -0.7303], atol=1e-4)


def test_solver_reward_rule():
    got = ssp.solver_reward(jnp.array([1, 1, 0, 0]), jnp.array([2, 11, 2, 30]), jnp.array([2, 11, 2, 30]))
    np.testing.assert_allclose(got, [1.0, 0.25, 0.0, 0.0])
    np.testing.assert_allclose(ssp.solver_reward(jnp.array([1]), jnp.array([10]), jnp.array([10])), [1.0])


def test_solver_reward_checks_open_and_close_counts_separately():
    """quark_score.py: `open_count > 10 or close_count > 10` (issue 15 item 6): unbalanced tags count too."""
    texts = ["<answer>4</answer>",
             "<answer>" * 11 + "4</answer>",                  # 11 open, 1 close
             "<answer>4" + "</answer>" * 11,                  # 1 open, 11 close
             "<answer>" * 10 + "4" + "</answer>" * 10,        # 10 and 10: not overused
             "no tags"]
    opens, closes = ssp.answer_tag_counts(texts)
    np.testing.assert_array_equal(opens, [1, 11, 1, 10, 0])
    np.testing.assert_array_equal(closes, [1, 1, 11, 10, 0])
    got = ssp.solver_reward(jnp.ones(5, jnp.int32), jnp.asarray(opens), jnp.asarray(closes))
    np.testing.assert_allclose(got, [1.0, 0.25, 0.25, 1.0, 1.0])
    # the old one-count API fed with the opening-tag count (its name's natural reading) missed sample 2
    open_only = ssp.solver_reward(jnp.ones(5, jnp.int32), jnp.asarray(opens), jnp.asarray(opens))
    np.testing.assert_allclose(open_only, [1.0, 0.25, 1.0, 1.0, 1.0])


def test_proposer_format_only_mode():
    """ssp_ray_trainer.py `reward_type == "format_only"`: 1 per extracted problem, the penalty otherwise."""
    r = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.25, 0.0, 1.0]])
    np.testing.assert_allclose(ssp.proposer_reward(r, mode="format_only"), [1.0, 1.0, 1.0])
    got = ssp.proposer_reward(r, mode="format_only", valid_P=jnp.array([1, 0, 1]), format_penalty=0.0)
    np.testing.assert_allclose(got, [1.0, 0.0, 1.0])


@pytest.mark.parametrize("mode", ["1-acc", "intermediate_difficulty", "format_only"])
def test_proposer_matches_reference_with_masks(mode):
    rng = np.random.default_rng(0)
    r = rng.choice([0.0, 0.25, 1.0], size=(6, 5))
    r[0], r[1] = 1.0, 0.0
    counts = np.array([5, 5, 3, 1, 0, 4])
    mask = np.arange(5)[None] < counts[:, None]
    valid = np.array([1, 1, 1, 1, 1, 0])
    got = ssp.proposer_reward(jnp.asarray(r), mode=mode, solver_mask_PN=jnp.asarray(mask),
                              valid_P=jnp.asarray(valid), format_penalty=-1.0)
    want = []
    for i in range(6):
        p = float(np.mean(r[i, : counts[i]] > 0)) if counts[i] else 0.0
        v = {"1-acc": 1 - p, "format_only": 1.0}.get(mode, 4 * p * (1 - p) if 0 < p < 1 else 0.0)
        want.append(v if valid[i] else -1.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_bad_mode_named():
    with pytest.raises(ValueError, match="mode='hard'"):
        ssp.proposer_reward(jnp.zeros((1, 2)), mode="hard")


class VariantsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        fn = self.variant(lambda r: ssp.proposer_reward(r, mode="intermediate_difficulty"))
        np.testing.assert_allclose(fn(jnp.array([[1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])),
                                   [0.96, 0.0], rtol=1e-6)
