"""experiments/afrl_vs_grpo.py: the probe sets, the probing recorder, and (slow) that the comparison is fair:
through the real trainer, SFT-aux with lambda_SFT = 0 is GRPO step for step (same warm start, data and rollout
keys; the probes agree too), so a difference in the full experiment comes from the SFT term.

No SFT-aux-vs-GRPO direction is asserted: at CI scale (a 2-layer model, 2 steps) none is robust.
"""

import numpy as np
import pytest

from experiments import afrl_vs_grpo as exp


def test_probe_sets_isolate_the_rules():
    sets = exp.probe_sets(16)
    assert set(sets) == {"rare", "common"}
    for rule, op, f in (("rare", "-", lambda a, b: a - b), ("common", "+", lambda a, b: a + b)):
        assert len(sets[rule]) == 16
        for r in sets[rule]:
            a, o, b = r["prompt"].removeprefix("What is ").removesuffix("?").split()
            assert o == op and int(r["answer"]) == f(int(a), int(b)) >= 0
    assert exp.OPS.count("-") / len(exp.OPS) == pytest.approx(1 / 14)


def test_probing_records_each_evaluation_and_restores():
    from jaxrl.rl import loop as rl_loop

    real = rl_loop.evaluate
    calls = []

    def fake(collect, params, records, encoder, spec, *, batch_size, **kw):
        calls.append(len(records))
        return {"eval/accuracy": len(records) / 10}

    rl_loop.evaluate = fake
    try:
        with exp.probing({"rare": [{}] * 2, "common": [{}] * 3}) as log:
            out = rl_loop.evaluate(None, None, [{}] * 5, None, None, batch_size=4, sampled=None)
        assert out == {"eval/accuracy": 0.5}  # the trainer's own result, unchanged
        assert log == [{"rare": 0.2, "common": 0.3}] and calls == [5, 2, 3]
        assert rl_loop.evaluate is fake
    finally:
        rl_loop.evaluate = real


@pytest.mark.slow  # ~2 min idle: SFT 150 steps of a 2-layer model + 2 x 2 RL steps with 2 evaluations each
def test_sft_aux_at_zero_lambda_is_grpo(tmp_path):
    probes = exp.probe_sets(8)
    # no RL step in the warm start; all 150 SFT steps: 60 at 3e-3 leave no rewarded rollout (measured)
    init = exp.warm_start(tmp_path / "warm", sft_steps=None, small=True, rl_step=False)
    # 8 prompts: the 8 test devices split 8 x 8 rollouts + 8 expert rows evenly (4 prompts' 36 rows are
    # refused by the batch sharding, a limit of sft_aux on a mesh)
    kw = dict(init=init, eval_every=2, lam=0.0, probes=probes, extra=["data.prompts_per_step=8"])
    grpo = exp.run_one("grpo", 0, 2, tmp_path / "grpo", **kw)
    aux = exp.run_one("sft_aux", 0, 2, tmp_path / "aux", **kw)
    assert grpo["eval_steps"].tolist() == [0, 2] and grpo["probe"].shape == (2, 2)
    assert np.all(np.isnan(grpo["sft_nll"]))  # the NLL is logged only when lambda_SFT > 0
    for key in ("probe", "reward", "eval_steps"):
        np.testing.assert_allclose(aux[key], grpo[key], rtol=1e-6, atol=1e-7, err_msg=key)
    # not vacuous: some rewarded rollout (nonzero advantages, so the policy moves before the last probes)
    assert grpo["reward"].max() > 0, grpo["reward"]
