"""`jaxrl eval` scores a trained run's checkpoint with greedy accuracy, avg@k and unbiased pass@k.

Invariants checked (they hold for any model): with binary correctness, the unbiased pass@1 equals avg@k
exactly; pass@j never decreases in j; every value is a probability; the eval command uses the run's own
config (rewards, prompt format) and its held-out split.
"""

from __future__ import annotations

import json
import subprocess
import sys

from _common import ROOT, env, run_train

from jaxrl import cli


def test_eval_reports_avg_and_pass_at_k(tmp_path, capsys):
    run = tmp_path / "run"
    proc = run_train(run, "data.eval_size=6", "train.steps=1")  # one trained step: a checkpoint to score
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "eval.json"
    # scored by a binary task reward (full marks where a digit appears) and the run's partial-credit one after it
    rewards = ("rewards=[{name: has_digit, type: function, function: '_train_rewards:has_digit'},"
               " {name: digits, type: function, function: '_train_rewards:digit_frac'}]")
    cmd = [sys.executable, "-m", "jaxrl.cli", "eval", "--checkpoint", str(run), "--k", "4", "--out", str(out),
           "--set", rewards]
    res = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r == json.loads(res.stdout)
    assert r["num_prompts"] == 6 and r["k"] == 4
    assert set(r) >= {"eval/accuracy", "eval/reward/has_digit/mean", "eval/reward/digits/mean", "eval/avg@4",
                      "eval/pass@1", "eval/pass@2", "eval/pass@4"}
    assert r["eval/accuracy"] == r["eval/reward/has_digit/mean"]  # binary: accuracy is the reward's mean
    assert abs(r["eval/pass@1"] - r["eval/avg@4"]) < 1e-12
    assert r["eval/pass@1"] <= r["eval/pass@2"] <= r["eval/pass@4"] <= 1.0
    assert r["eval/pass@4"] > 0  # some random completions hold a digit
    # refused before any model work: `jaxrl.cli.main` in this process (its return value is the exit status)
    assert cli.main(["eval", "--checkpoint", str(run), "--k", "0"]) == 2
    assert "--k=0: must be >= 1" in capsys.readouterr().err


def test_only_full_marks_count_as_correct():
    """Partial credit is not a right answer: reasoning-gym's scorer gives an answer that merely contains the
    reference len(ref) / len(answer), countdown a parsable wrong expression its format score."""
    import types

    import numpy as np

    from jaxrl.rl import evaluate as evaluate_lib
    from jaxrl.rewards.gym import reasoning_gym_score
    from jaxrl.sampling import SamplingSpec

    meta = json.dumps({"expression": "3 + 4"})
    gym = reasoning_gym_score(["q"] * 3, ["7", "3 + 4 = 7, so 7 it is", "8"], answer=["7"] * 3,
                              task=["basic_arithmetic"] * 3, metadata=[meta] * 3)
    assert gym[0] == 1.0 and 0 < gym[1] < 1 and gym[2] == 0.0
    r_B = np.asarray([*gym, np.nan, 1.5], np.float32)  # NaN: a reward that did not score the row
    assert evaluate_lib.correct(r_B).tolist() == [True, False, False, False, True]

    def collect(params, batch, spec, seed):  # prompt i scores r_B[i] on every sample
        rows = np.repeat(r_B[[int(rec["prompt"]) for rec in batch]], spec.num_samples)
        return types.SimpleNamespace(rewards_BR=rows[:, None], reward_names=("answer",))

    records = [{"prompt": str(i)} for i in range(5)]
    out = evaluate_lib.evaluate(collect, None, records, lambda rec: rec, SamplingSpec(max_new_tokens=1),
                                batch_size=2, sampled=SamplingSpec(max_new_tokens=1, num_samples=2))
    assert out["eval/accuracy"] == 0.4 and out["eval/avg@2"] == 0.4 and out["eval/pass@2"] == 0.4


def test_a_per_role_adapter_run_is_refused_in_one_line():
    """`jaxrl eval` plays one policy; a run with one adapter set per role is refused before any model work."""
    import pytest

    from jaxrl.config import load_config
    from jaxrl.errors import UserError
    from jaxrl.rl.setup import eval_collector

    cfg = load_config(ROOT / "configs" / "march_tiny.yaml", ["model.lora={rank: 4, alpha: 8}",
                                                             "multi_agent.adapters=per_role"])
    with pytest.raises(UserError, match=r"^multi_agent.adapters='per_role': jaxrl eval runs one policy"):
        eval_collector(cfg, None, None, None)
