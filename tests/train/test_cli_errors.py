"""`jaxrl train` config errors exit 2 with one line through `jaxrl.cli.main`, before any model is built."""

import pytest

from jaxrl import cli


def test_misspelt_key_names_the_closest_valid_key(capsys):
    assert cli.main(["train", "--set", "optimzer.lr=1", "--run-dir", "/nonexistent/never-created"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxrl train: error: ")
    assert "optimzer" in lines[0] and "optimizer" in lines[0].replace("optimzer", "")
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("override, words", [
    ("optimizer.lrr=1", ("optimizer.lrr", "optimizer.lr")),
    ("algorithm.name=trpo", ("algorithm.name", "grpo")),
    ("algorithm.ppo.lam=1.5", ("algorithm.ppo.lam", "[0, 1]")),
    ("algorithm.ppo.gamma=-0.1", ("algorithm.ppo.gamma", "[0, 1]")),
    ("algorithm.ppo.critic_lora=true", ("algorithm.ppo.critic_lora", "model.lora")),
    ("algorithm.mini_batches=0", ("algorithm.mini_batches", ">= 1")),
])
def test_bad_values_exit_2_naming_the_key(capsys, override, words):
    assert cli.main(["train", "--set", override]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    for w in words:
        assert w in err
