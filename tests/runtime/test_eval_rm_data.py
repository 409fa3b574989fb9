"""`jaxrl eval-rm RUN DATA`: a file is evaluated as a file whatever its name; only `synthetic[:BIAS]` names
the built-in set, and DATA is read before the reward model loads."""

import json

import pytest

from jaxrl.cli import main
from jaxrl.commands.eval_rm import synthetic_bias

PAIRS = [{"prompt": "1+2=", "chosen": "3", "rejected": "well, I think that it is 4"},
         {"prompt": "2+2=", "chosen": "well, I think that it is 4", "rejected": "5"},
         {"prompt": "3+2=", "chosen": "5", "rejected": "6"}]


def test_synthetic_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert synthetic_bias("synthetic") == "length"
    assert synthetic_bias("synthetic:format") == "format"
    assert synthetic_bias("synthetic_mine.jsonl") is None and synthetic_bias("synthetics.jsonl") is None
    (tmp_path / "synthetic").write_text("")
    assert synthetic_bias("synthetic") is None  # an existing file named "synthetic" is data


def test_bad_data_file_fails_before_the_model_loads(tmp_path, capsys):
    data = tmp_path / "synthetic_mine.jsonl"
    data.write_text("{not json\n")
    assert main(["eval-rm", str(tmp_path / "no-such-run"), str(data)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{data}:1: invalid JSON" in err


@pytest.mark.slow
def test_file_named_synthetic_is_evaluated(tmp_path, capsys):
    run = tmp_path / "rm"
    assert main(["train-rm", "--set", "train.steps=1", "--set", "data.train_size=16", "--set",
                 "data.eval_size=8", "--set", "data.batch_size=8", "--set", "train.eval_every=0",
                 "--set", "checkpoint.async_save=false", "--run-dir", str(run)]) == 0
    data = tmp_path / "synthetic_mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    capsys.readouterr()
    assert main(["eval-rm", str(run), str(data)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["out"]
    assert out == str(run / "eval_rm_synthetic_mine.json")
    report = json.loads((run / "eval_rm_synthetic_mine.json").read_text())
    assert report["num_pairs"] == 3 and report["data"] == str(data)
