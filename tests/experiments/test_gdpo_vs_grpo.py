"""experiments/gdpo_vs_grpo.py: the collapse counter on hand-computed groups, and a 2-step run through the
real trainer whose recorded reward vectors match the trainer's own logged reward means.

No direction of the GDPO-vs-GRPO comparison is asserted: at CI scale (a 2-layer model after 60 SFT steps)
joint success is 0 for both methods, so only the measured quantities are checked.
"""

import json

import numpy as np
import pytest

from experiments import gdpo_vs_grpo as exp


def _gdpo_ref(r_GR):
    """float64 numpy GDPO advantages of one group (per-reward group z-score, sum, then batch z-score)."""
    r_GR = np.asarray(r_GR, np.float64)
    a_GR = (r_GR - r_GR.mean(0)) / (r_GR.std(0, ddof=1) + 1e-6)
    p_G = a_GR.sum(1)
    return (p_G - p_G.mean()) / (p_G.std(ddof=1) + 1e-6)


def test_collapse_count_by_hand():
    # answer, format, length. Sums 2, 2, 2, 0: GRPO gives (1,1,0) and (0,1,1) one advantage.
    r_GR = np.array([[1, 1, 0], [0, 1, 1], [0, 1, 1], [0, 0, 0]], np.float64)
    grpo_G = np.array([0.5, 0.5, 0.5, -1.5])  # (2 - 1.5) / std(2,2,2,0) = 0.5 / 1
    assert exp.collapse_count(r_GR, grpo_G) == (3, 1)
    # GDPO by hand: answer 1.5/-0.5, format 0.5/-1.5, length -/+0.866 -> 1.134, 0.866, 0.866, -2.866
    assert exp.collapse_count(r_GR, _gdpo_ref(r_GR)) == (3, 0)
    assert exp.step_collapse(r_GR, 4, "grpo") == (3.0, 1.0)
    assert exp.step_collapse(r_GR, 4, "gdpo") == (3.0, 0.0)
    np.testing.assert_allclose(exp.advantages(r_GR, 4, "gdpo"), _gdpo_ref(r_GR), atol=1e-5)


def test_gdpo_can_collapse_too():
    # answer and length with the same group marginals: (1,1,0) and (0,1,1) are symmetric, GDPO ties them too.
    r_GR = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0], [1, 1, 1]], np.float64)
    np.testing.assert_allclose(_gdpo_ref(r_GR)[0], _gdpo_ref(r_GR)[1], atol=1e-9)
    assert exp.step_collapse(r_GR, 4, "gdpo") == (4.0, 1.0)
    assert exp.step_collapse(r_GR, 4, "grpo") == (4.0, 1.0)  # sums 2, 2, 0, 3
    # two groups: the means are over groups
    both = np.concatenate([r_GR, np.array([[1, 1, 0], [0, 1, 1], [0, 1, 1], [0, 0, 0]])])
    assert exp.step_collapse(both, 4, "gdpo") == (3.5, 0.5)


def test_identical_vectors_are_one_vector():
    r_GR = np.ones((4, 3))
    assert exp.collapse_count(r_GR, np.zeros(4)) == (1, 0)
    # three distinct vectors on one advantage merge two of them
    r_GR = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], np.float64)
    assert exp.collapse_count(r_GR, np.array([0.5, 0.5, 0.5, -1.5])) == (4, 2)


def test_length_budget():
    out = exp.length_budget(["p"] * 3, ["a", "b", "c"], completion_length=[19, 20, 21], budget=20)
    assert out == [1.0, 1.0, 0.0]


@pytest.mark.slow  # ~40 s idle: SFT 60 steps + 2 RL steps of a 2-layer model
def test_recorded_rewards_match_trainer_metrics(tmp_path):
    # a short warm start (60 steps at 3x the config's learning rate): the rewards still vary, asserted below
    out = exp.run_one("grpo", 0, 2, tmp_path / "run", budget=20, small=True,
                      extra=["sft_warmup.steps=60", "sft_warmup.lr=3e-3"])
    r_TBR = out["rewards_TBR"]
    assert r_TBR.shape == (2, 4 * out["group_size"], 3)
    assert set(np.unique(r_TBR)) <= {0.0, 1.0}
    # not vacuous: on every step some reward is 1 on some rollouts and 0 on others
    assert np.all((r_TBR.max(axis=1) > r_TBR.min(axis=1)).any(axis=1)), r_TBR.mean(axis=1)
    rows = [r for r in out["rows"] if "reward/answer/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for t, row in enumerate(rows):
        for k, name in enumerate(exp.NAMES):
            assert r_TBR[t, :, k].mean() == pytest.approx(row[f"reward/{name}/mean"], abs=1e-6)
    # the recorder is removed after the run
    from jaxrl.rl import loop as rl_loop, step as rl_step
    assert rl_loop.rl_step is rl_step.rl_step
    json.dumps(out["eval_accuracy"])
