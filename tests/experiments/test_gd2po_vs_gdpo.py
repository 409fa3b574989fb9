"""experiments/gd2po_vs_gdpo.py: the conflict counter on hand-made groups, and (slow) that it measures what
the trainer's GD²PO drops: through the real trainer, the trainer's logged `gd2po/conflict_frac` and
`gd2po/keep_frac` equal the conflict share the script computes from the recorded rewards, step by step.

No GD²PO-vs-GDPO direction is asserted: at CI scale (a 2-layer model, 2 steps) none is robust.
"""

import numpy as np
import pytest

from experiments import gd2po_vs_gdpo as exp


def test_group_conflicts_by_hand():
    # answer, length. Group 1: answer advantages +,-,-,+ and length -,+,-,+: samples 0 and 1 conflict.
    # Group 2: every sample (1, 1): all advantages 0, no conflict.
    r_BR = np.array([[1, 0], [0, 1], [0, 0], [1, 1]] + [[1, 1]] * 4, np.float64)
    assert exp.group_conflicts(r_BR, 4) == (0.5, 0.25)
    # rewards that agree on every sample never conflict; a nested pair does: (0, 1) is wrong but short
    assert exp.group_conflicts(np.array([[1, 1], [0, 0], [1, 1], [0, 0]], np.float64), 4) == (0.0, 0.0)
    nested = np.array([[1, 1], [0, 1], [0, 0], [0, 1]], np.float64)  # answer +,-,-,-; length +,+,-,+
    assert exp.group_conflicts(nested, 4) == (1.0, 0.5)
    # one reward constant in the group: its advantage is 0, which is neither sign
    assert exp.group_conflicts(np.array([[1, 1], [0, 1], [1, 1], [0, 1]], np.float64), 4) == (0.0, 0.0)


def test_overrides_pick_the_mode():
    from jaxrl.config import load_config

    for method, name, mode in (("gdpo", "gdpo", "hard"), ("gd2po_hard", "gd2po", "hard"),
                               ("gd2po_snr", "gd2po", "snr")):
        sets = exp.overrides(method, 0, 2, budget=4, tau=0.8, sft_steps=0)
        cfg = load_config("configs/quickstart.yaml", sets)
        assert cfg.algorithm.name == name
        assert cfg.algorithm.params == ({"mode": mode, "tau": 0.8} if name == "gd2po" else {})
        assert [r.name for r in cfg.rewards] == ["answer", "length"]


@pytest.mark.slow  # ~40 s idle: SFT 60 steps of a 2-layer model + 3 RL steps
def test_measured_conflicts_are_what_gd2po_drops(tmp_path):
    # a short warm start (60 steps at 3x the config's learning rate, no RL step) and no held-out evaluation
    # (not checked): the rollouts still conflict, asserted below
    init = exp.warm_start(tmp_path / "warm", sft_steps=None, small=True, rl_step=False,
                          extra=["sft_warmup.steps=60", "sft_warmup.lr=3e-3"])
    out = exp.run_one("gd2po_hard", 0, 3, tmp_path / "run", init=init, budget=4, tau=0.8, eval_every=0)
    r_TBR = out["rewards_TBR"]
    assert r_TBR.shape == (3, 4 * out["group_size"], 2)
    rows = [r for r in out["rows"] if "gd2po/conflict_frac" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r_BR, row in zip(r_TBR, rows):
        _, samples = exp.group_conflicts(r_BR, out["group_size"])
        assert row["gd2po/conflict_frac"] == pytest.approx(samples, abs=1e-6)
        assert row["gd2po/keep_frac"] == pytest.approx(1.0 - samples, abs=1e-6)
        assert r_BR[:, 1].mean() == pytest.approx(row["reward/length/mean"], abs=1e-6)
    # not vacuous: some step has conflicting samples for GD²PO to drop
    assert max(r["gd2po/conflict_frac"] for r in rows) > 0, [r["gd2po/conflict_frac"] for r in rows]


def test_snr_at_tau_08_drops_what_hard_drops_for_two_binary_rewards_in_groups_of_8():
    # A conflicting sample of two binary rewards has per-reward z-scores a > 0 > -b with a / b at most G - 1
    # (one 1 in each reward), so |s| = |a - b| / (a + b) <= (G - 2) / G = 0.75 < 0.8: SNR keeps none of them.
    import jax.numpy as jnp

    from jaxrl import losses

    rng = np.random.default_rng(0)
    r_BR = jnp.asarray(rng.integers(0, 2, (8 * 64, 2)), jnp.float32)
    m_BT = jnp.ones((8 * 64, 3), bool)
    hard, mh = losses.gd2po_advantages(r_BR, 8, m_BT, mode="hard")
    snr, ms = losses.gd2po_advantages(r_BR, 8, m_BT, mode="snr", tau=0.8)
    assert 0.1 < float(mh["gd2po/conflict_frac"]) < 0.9
    np.testing.assert_array_equal(np.asarray(snr), np.asarray(hard))
    # the extreme group: |s| = 0.75 exactly, kept at tau 0.7, dropped at 0.8
    g_BR = jnp.asarray([[1, 0], [0, 1]] + [[0, 0]] * 6, jnp.float32)
    m8 = jnp.ones((8, 3), bool)
    assert float(losses.gd2po_advantages(g_BR, 8, m8, mode="snr", tau=0.7)[1]["gd2po/keep_frac"]) == 1.0
    assert float(losses.gd2po_advantages(g_BR, 8, m8, mode="snr", tau=0.8)[1]["gd2po/keep_frac"]) == 0.75
    assert exp.group_conflicts(np.asarray(g_BR), 8) == (1.0, 0.25)
