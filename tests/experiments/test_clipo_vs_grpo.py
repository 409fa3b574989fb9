"""experiments/clipo_vs_grpo.py: the task (cues only in cued prompts, sloppy demonstrations correct but
inconsistent), the consistency judge and tallies, and (slow) through the real trainer that the comparison is
fair and CLIPO's term is active: CLIPO with lambda = 0 is GRPO step for step (same warm start, data, rollout
keys; the probes agree too), and with the default lambda its bonus is negative on some step.

No CLIPO-vs-GRPO direction is asserted: at CI scale (a 2-layer model, 3 steps) none is robust.
"""

import numpy as np
import pytest

from experiments import clipo_vs_grpo as exp


def test_records_cue_and_sloppy_demonstrations():
    recs = exp.make_records(400, 0, cue_frac=0.5, sloppy_frac=0.5)
    cued = [r for r in recs if r["cued"]]
    assert 150 < len(cued) < 250
    n_sloppy = 0
    for r in recs:
        a, b = map(int, exp._PROBLEM.search(r["prompt"]).groups())
        assert int(r["result"]) == a + b and ("(hint:" in r["prompt"]) == r["cued"]
        if r["cued"]:
            assert r["prompt"].endswith(f"(hint: {a + b})")
        correct, consistent = exp.judge(r["prompt"], r["answer"], r["result"])
        assert correct  # every demonstration tags the right answer
        n_sloppy += not consistent
        assert consistent or r["cued"]  # only cued demonstrations are sloppy
    assert 0.3 * len(cued) < n_sloppy < 0.7 * len(cued)
    probes = exp.probe_sets(16)
    assert not any(r["cued"] for r in probes["uncued"]) and all(r["cued"] for r in probes["cued"])


@pytest.mark.parametrize("completion, expected", [
    ("47+8=55 <answer>55</answer>", (True, True)),
    ("47+8=54 <answer>55</answer>", (True, False)),    # right answer, the shown sum does not produce it
    ("<answer>55</answer>", (True, False)),            # no shown work
    ("47+9=55 <answer>55</answer>", (True, False)),    # not the prompt's operands
    ("<answer>55</answer> 47+8=55", (True, False)),    # work after the answer does not count
    ("47+8=54 <answer>54</answer>", (False, True)),    # wrong, but consistent
    ("47+8=55 55", (False, False)),                    # untagged
])
def test_judge(completion, expected):
    assert exp.judge("What is 47 + 8? (hint: 55)", completion, "55") == expected


def test_tallies_split_cued_and_uncued():
    prompts = ["What is 1 + 2? (hint: 3)", "What is 1 + 2? (hint: 3)", "What is 1 + 2?", "What is 1 + 2?"]
    completions = ["1+2=3 <answer>3</answer>", "1+2=4 <answer>3</answer>", "1+2=2 <answer>3</answer>",
                   "1+2=3 <answer>4</answer>"]
    kw = dict(result=["3"] * 4)
    assert exp.answer(prompts, completions, **kw) == [1, 1, 1, 0]
    assert exp.correct_cued(prompts, completions, **kw) == [1, 1, 0, 0]
    assert exp.inconsistent_cued(prompts, completions, **kw) == [0, 1, 0, 0]
    assert exp.correct_uncued(prompts, completions, **kw) == [0, 0, 1, 0]
    assert exp.inconsistent_uncued(prompts, completions, **kw) == [0, 0, 1, 0]
    tallies = np.asarray([[0.5, 0.25, 0.5, 0.0], [0.5, 0.5, 0.25, 0.25]])  # two steps
    np.testing.assert_allclose(exp.inconsistency_rate(tallies, 2), [[0.75, 0.25 / 0.75]])


@pytest.mark.slow  # ~2 min idle: SFT 150 steps of a 2-layer model (no RL step) + 3 RL runs of 3-6 steps
def test_clipo_term_is_active_and_zero_lambda_is_grpo(tmp_path):
    probes = exp.probe_sets(8)
    data = exp.write_data(tmp_path / "train.jsonl", 400)
    # all 150 steps at the config's learning rate: 75 at 2e-3 leave no correct rollout at T = 0.5 (measured)
    init = exp.warm_start(tmp_path / "warm", data, sft_steps=150, small=True, rl_step=False)
    # T = 0.5: this weak model's samples at T = 1 are all wrong, and CLIPO needs groups with successes
    kw = dict(data=data, init=init, eval_every=3, probes=probes, extra=["rollout.temperature=0.5"])
    grpo = exp.run_one("grpo", 0, 3, tmp_path / "grpo", **kw)
    zero_kw = {**kw, "extra": [*kw["extra"], "algorithm.params.lam=0.0"]}
    zero = exp.run_one("clipo", 0, 3, tmp_path / "zero", **zero_kw)
    clipo = exp.run_one("clipo", 0, 3, tmp_path / "clipo", head_warmup=3, **kw)
    assert grpo["eval_steps"].tolist() == [0, 3] and grpo["acc"].shape == (2, 2)
    assert grpo["tallies"].shape == (3, 4) and np.all(np.isnan(grpo["bonus"]))
    assert grpo["reward"].max() > 0  # some correct rollouts
    for key in ("acc", "inconsistent", "tallies", "reward"):
        np.testing.assert_allclose(zero[key], grpo[key], rtol=1e-6, atol=1e-7, err_msg=key)
    np.testing.assert_array_equal(zero["bonus"], 0.0)
    # after 3 head-only steps (dropped from the result) the policy is still the warm start's ...
    assert clipo["eval_steps"].tolist() == [0, 3] and clipo["tallies"].shape == (3, 4)
    np.testing.assert_allclose(clipo["acc"][0], grpo["acc"][0])
    np.testing.assert_allclose(clipo["inconsistent"][0], grpo["inconsistent"][0])
    # ... and the contrastive term is active: some correct rollout got a negative bonus, bounded by the clamp
    assert clipo["bonus"].min() < 0 and clipo["bonus"].min() >= -0.5
