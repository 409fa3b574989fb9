"""A resume this config cannot do fails before anything in the run directory is written: exit 2, one line
naming every differing field; config.yaml and model_config.json stay byte-identical and the original
checkpoints still sample. (The trainer used to rewrite both files first, then fail on a shape mismatch.)"""

import json

import pytest

from jaxrl.runtime import run_checks as run_dir
from jaxrl.cli import main
from jaxrl.config import dump_config, load_config
from jaxrl.errors import ConfigError
from jaxrl.io.tokenizer import builtin_tokenizer
from tests.runtime import _trainer as T


@pytest.mark.slow
def test_changed_model_on_resume_exits_2_and_leaves_the_run_intact(tmp_path, capsys):
    cfg, run_dir = T.write_config(tmp_path), tmp_path / "run"
    first = T.run(T.train_argv(cfg, run_dir))
    assert first.returncode == 0, first.stderr[-3000:]
    files = [run_dir / "config.yaml", run_dir / "checkpoints" / "model_config.json"]
    before = [f.read_bytes() for f in files]
    steps_before = T.steps_in(run_dir)

    bad = T.run(T.train_argv(cfg, run_dir, "train.steps=4", "model.overrides.num_layers=2",
                             "algorithm.name=dapo"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    line = bad.stderr.strip().splitlines()[-1]
    assert line.startswith(f"jaxrl train: error: cannot resume the run in {run_dir} with this config: ")
    assert "model num_layers: 1 in the run, 2 in this config" in line
    assert "algorithm.name: 'grpo' in the run, 'dapo' in this config" in line
    assert [f.read_bytes() for f in files] == before and T.steps_in(run_dir) == steps_before

    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "1+2=", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    assert "=== prompt 0 sample 0" in capsys.readouterr().out


def _fake_run(tmp_path, cfg, tokenizer, model_json):
    run = tmp_path / "run"
    (run / "checkpoints" / "3" / "params").mkdir(parents=True)
    (run / "checkpoints" / "model_config.json").write_text(json.dumps(model_json))
    tokenizer.save_pretrained(str(run / "checkpoints" / "tokenizer"))
    (run / "config.yaml").write_text(dump_config(cfg))
    return run


def test_check_resume_names_tokenizer_and_model_fields(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    cfg = load_config(str(T.write_config(tmp_path)))
    tok = builtin_tokenizer()
    expected = run_dir._expected_model(cfg, tok)
    run_dir.check_resume(cfg, _fake_run(tmp_path / "same", cfg, tok, expected))  # compatible: no error

    vocab = {f"w{i}": i for i in range(64)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="w2", pad_token="w0")
    run = _fake_run(tmp_path / "other", cfg, other, {**expected, "rope_theta": 500.0})
    with pytest.raises(ConfigError) as e:
        run_dir.check_resume(cfg, run)
    msg = str(e.value)
    assert "model rope_theta: 500.0 in the run, 10000.0 in this config" in msg
    assert "tokenizer vocab_size: 64 in the run, 102 in this config" in msg
    assert "tokenizer eos_token_id: 2 in the run, 1 in this config" in msg
    assert "algorithm" not in msg and "dtype" not in msg


def test_check_resume_checks_mesh_divisibility(tmp_path):
    cfg = load_config(str(T.write_config(tmp_path)), ["mesh.fsdp=8", "model.overrides.hidden_size=36",
                                                      "model.overrides.head_dim=18"])
    tok = builtin_tokenizer()
    run = _fake_run(tmp_path, cfg, tok, run_dir._expected_model(cfg, tok))
    with pytest.raises(ConfigError, match=r"not divisible by mesh axis fsdp=8"):
        run_dir.check_resume(cfg, run)


def test_check_resume_refuses_other_reward_columns_and_allows_new_weights(tmp_path):
    """The rewards' names and types (in order) are the columns of every rollout's reward matrix, its
    per-reward metrics and GDPO's per-reward normalisation: a resume with others is refused, naming both
    lists; new weights or params are a choice a resumed run may make."""
    cfg = load_config(str(T.write_config(tmp_path)))
    tok = builtin_tokenizer()
    run = _fake_run(tmp_path, cfg, tok, run_dir._expected_model(cfg, tok))
    reweighted = load_config(str(T.write_config(tmp_path)), [
        "rewards=[{name: answer, type: math_answer, weight: 0.5, params: {tags_only: true}}]"])
    run_dir.check_resume(reweighted, run)  # no error
    for sets, now in [
        ("rewards=[{name: answer, type: format, params: {tags: [answer]}}]", "answer: format"),
        ("rewards=[{name: answer, type: math_answer}, {name: short, type: length, params: {target: 4}}]",
         "answer: math_answer, short: length"),
        ("rewards=[{name: right, type: math_answer}]", "right: math_answer"),
    ]:
        with pytest.raises(ConfigError) as e:
            run_dir.check_resume(load_config(str(T.write_config(tmp_path)), [sets]), run)
        assert f"rewards: [answer: math_answer] in the run, [{now}] in this config" in str(e.value), sets
