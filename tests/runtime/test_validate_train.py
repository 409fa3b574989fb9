"""`jaxrl train` checks its inputs before building anything (`jaxrl.run_checks.validate_train`): an HF model
without tokenizer files (it used to train silently with the 102-character built-in tokenizer), a run
directory that is a file or lies under one; each is one line, exit 2, and nothing is created."""

import pytest

from jaxrl.cli import main
from tests.hf._tiny_hf import make_tiny_hf
from tests.runtime import _trainer as T


def _hf_config(tmp_path, hf_dir, tokenizer: str = "{kind: builtin}"):
    text = T.TINY.replace("  preset: tiny\n", f"  preset: null\n  hf_path: {hf_dir}\n")
    text = "\n".join(line for line in text.split("\n") if not line.startswith("  overrides:"))
    text = text.replace("tokenizer: {kind: builtin}", f"tokenizer: {tokenizer}")
    cfg = tmp_path / "hf.yaml"
    cfg.write_text(text)
    return cfg


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_hf_model_without_tokenizer_files_is_an_error(tmp_path, capsys):
    make_tiny_hf("llama", tmp_path / "hf")
    cfg = _hf_config(tmp_path, tmp_path / "hf")
    capsys.readouterr()  # transformers' progress bar
    assert main(["train", str(cfg), "--run-dir", str(tmp_path / "run")]) == 2
    err = _one_line(capsys)
    assert f"model.hf_path={tmp_path / 'hf'}: no tokenizer files there" in err
    assert "tokenizer.kind=hf and tokenizer.path" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("layout,message", [("file", "exists and is not a directory"),
                                            ("under_file", "is a file, not a directory")])
def test_run_dir_that_cannot_be_a_directory(tmp_path, capsys, layout, message):
    cfg = T.write_config(tmp_path)
    (tmp_path / "afile").write_text("x")
    run_dir = tmp_path / "afile" if layout == "file" else tmp_path / "afile" / "run"
    assert main(["train", str(cfg), "--run-dir", str(run_dir)]) == 2
    err = _one_line(capsys)
    assert err.startswith("jaxrl train: error: run directory") and message in err
    assert (tmp_path / "afile").read_text() == "x"
