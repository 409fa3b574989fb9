"""experiments/etr_vs_grpo.py: the curves read from metrics rows, the report's statistics on hand-made runs,
and (slow) that the comparison is fair: through the real trainer, ETR with alpha = beta = 0 is GRPO step for
step (same warm start, data and rollout keys), so any difference in the full experiment comes from the
elastic clip.

No ETR-vs-GRPO direction is asserted: at CI scale (a 2-layer model, 2 steps) none is robust.
"""

import numpy as np
import pytest

from experiments import etr_vs_grpo as exp


def _rows(steps, evals):
    rows = [{"step": t, "entropy": 1.0 - 0.1 * t, "clip_frac": 0.01 * t, "reward/mean": 0.1 * t}
            for t in range(1, steps + 1)]
    return rows + [{"step": s, "eval/accuracy": a} for s, a in evals]


def test_curves_from_rows():
    c = exp.curves(_rows(4, [(4, 0.5), (0, 0.25)]), 4)
    np.testing.assert_allclose(c["entropy"], [0.9, 0.8, 0.7, 0.6])
    np.testing.assert_allclose(c["clip_frac"], [0.01, 0.02, 0.03, 0.04])
    np.testing.assert_allclose(c["eval"], [[0, 0.25], [4, 0.5]])  # sorted by step
    with pytest.raises(ValueError, match="steps 1..5"):
        exp.curves(_rows(4, []), 5)


def test_report_statistics(tmp_path):
    def run(ent, acc):
        return {"entropy": np.asarray(ent, float), "clip_frac": np.zeros(4), "reward/mean": np.zeros(4),
                "eval": np.asarray([[0, 0.2], [4, acc]])}

    runs = {"grpo": [run([1, 1, 1, 0.5], 0.5), run([1, 1, 1, 0.7], 0.7)],
            "etr": [run([1, 1, 1, 0.8], 0.5), run([1, 1, 1, 0.8], 0.6)]}
    text = exp.report(runs, [0, 1], tmp_path, seconds=60.0, setting="hand-made")
    # k = 1: the last step's entropy; ETR - GRPO per seed 0.3, 0.1; final accuracy 0.0, -0.1
    assert "[0.3, 0.1]" in text and "[0.0, -0.1]" in text
    grpo_row = next(line for line in text.splitlines() if line.startswith("| grpo"))
    assert "0.600 ± 0.141 [0.500, 0.700]" in grpo_row  # last-step entropy = final accuracy here
    assert (tmp_path / "etr_vs_grpo.md").read_text() == text


def test_save_load_round_trip(tmp_path):
    c = exp.curves(_rows(3, [(0, 0.1), (3, 0.4)]), 3)
    exp.save_run(tmp_path / "r.npz", c)
    back = exp.load_run(tmp_path / "r.npz")
    assert set(back) == set(c)
    for k in c:
        np.testing.assert_array_equal(back[k], c[k])


# The CI warm start: short (SFT_STEPS at a higher learning rate than the config's 1e-3) and without the RL
# step the full experiment takes; enough for rewarded rollouts, which the test asserts.
SFT_STEPS, SFT_LR = 60, 3e-3


@pytest.mark.slow  # ~1 min idle: SFT 60 steps of a 2-layer model + 2 x 2 RL steps with 2 x 2 updates
def test_etr_at_zero_elasticity_is_grpo(tmp_path):
    kw = dict(eval_every=2, alpha=0.0, beta=0.0, updates=2, sft_steps=None, small=True)
    init = exp.warm_start(0, tmp_path / "warm", sft_steps=None, small=True, rl_step=False,
                          extra=[f"sft_warmup.steps={SFT_STEPS}", f"sft_warmup.lr={SFT_LR}"])
    grpo = exp.run_one("grpo", 0, 2, tmp_path / "grpo", init=init, **kw)
    etr = exp.run_one("etr", 0, 2, tmp_path / "etr", init=init, **kw)
    assert grpo["eval"][:, 0].tolist() == [0, 2]
    for key in ("entropy", "clip_frac", "reward/mean", "eval"):
        np.testing.assert_allclose(etr[key], grpo[key], rtol=1e-6, atol=1e-7, err_msg=key)
    assert np.all(np.isfinite(grpo["entropy"])) and np.all(grpo["entropy"] > 0)
    # not vacuous: rewarded rollouts (nonzero advantages) on every step, and the clip acted
    assert np.all(grpo["reward/mean"] > 0) and grpo["clip_frac"].max() > 0, (grpo["reward/mean"], grpo["clip_frac"])
