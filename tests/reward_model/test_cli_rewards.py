"""train-rm / eval-rm CLI (config errors exit 2; a tiny run, resume, eval JSON) and the model / pairwise
rewards."""

import json

import numpy as np
import pytest

from jaxrl.cli import main
from jaxrl.rewards.judges.model_reward import model_reward, pairwise_reward


def test_unknown_key_exits_2(capsys):
    assert main(["train-rm", "--set", "bogus=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'bogus'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("override,message", [
    ("debias.attribute=people",
     "debias.attribute='people': allowed values are 'length', 'sycophancy', 'format'"),
    ("debias.gama=1", "did you mean 'debias.gamma'"),
    ("data.chosen_longer_rate=1.5", "data.chosen_longer_rate=1.5: must be in [0, 1]"),
])
def test_bad_values_exit_2(override, message, capsys):
    assert main(["train-rm", "--set", override]) == 2
    assert message in capsys.readouterr().err


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["train-rm", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err


def _judge_by_length(prompt, a, b):
    if "boom" in (a, b):
        raise RuntimeError("judge failed")
    return float(len(a) - len(b))


def test_pairwise_reward_hand_computed():
    # S_ij = len_i - len_j, so ½(S_ij − S_ji) = len_i − len_j and R_i = mean_{j≠i}(len_i − len_j).
    comps = ["a", "abc", "ab", "abcd", "x", "xy"]
    r = pairwise_reward(["p"] * 6, comps, judge=_judge_by_length, group_size=3)
    np.testing.assert_allclose(r[:3], [(-2 - 1) / 2, (2 + 1) / 2, (1 - 1) / 2], atol=1e-6)
    np.testing.assert_allclose(r[3:], [(3 + 2) / 2, (-3 - 1) / 2, (-2 + 1) / 2], atol=1e-6)
    r = pairwise_reward(["p"] * 3, ["a", "abc", "boom"], judge=_judge_by_length, group_size=3)
    np.testing.assert_allclose(r, [-2.0, 2.0, 0.0], atol=1e-6)   # pairs with the failing sample are left out


@pytest.mark.slow
def test_train_resume_eval_and_model_reward(tmp_path, capsys):
    run = tmp_path / "run"
    common = ["--set", "data.train_size=64", "--set", "data.eval_size=16", "--set", "data.batch_size=8",
              "--set", "checkpoint.every=2", "--set", "checkpoint.async_save=false",
              "--set", "train.eval_every=0", "--set", "logging.every=1",
              "--set", "debias.enabled=true", "--set", "debias.hidden_dim=8", "--run-dir", str(run)]
    assert main(["train-rm", "--set", "train.steps=2", *common]) == 0
    assert main(["train-rm", "--set", "train.steps=4", *common]) == 0      # resumes from step 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if "rm/loss" in r]
    assert train_steps == [1, 2, 3, 4] and all("dir/club_mi" in r for r in rows if "rm/loss" in r)
    report = json.loads((run / "eval_rm.json").read_text())
    assert report["num_pairs"] == 16 and set(report["attributes"]) == {"length", "sycophancy", "format"}
    capsys.readouterr()

    pairs = tmp_path / "pairs.jsonl"
    recs = [{"prompt": "1+2=", "chosen": "3", "rejected": "well, I think that it is 4"},
            {"prompt": "2+2=", "chosen": "well, I think that it is 4", "rejected": "5"}]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["eval-rm", str(run), str(pairs), "--out", str(tmp_path / "e.json")]) == 0
    ev = json.loads((tmp_path / "e.json").read_text())
    assert ev["num_pairs"] == 2 and ev["attributes"]["length"]["a_rate"] == 0.5

    scores = model_reward([r["prompt"] for r in recs] * 2,
                          [r["chosen"] for r in recs] + [r["rejected"] for r in recs],
                          checkpoint=str(run), batch_size=3)
    margin = np.array(scores[:2]) - np.array(scores[2:])
    np.testing.assert_allclose(ev["margin_mean"], margin.mean(), atol=1e-5)
    assert main(["eval-rm", str(run), str(tmp_path / "missing.jsonl")]) == 2
