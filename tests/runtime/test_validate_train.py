"""`jaxrl train` checks its inputs before building anything (`jaxrl.runtime.run_checks.validate_train`): an HF model
without tokenizer files (it used to train silently with the 102-character built-in tokenizer), a run
directory that is a file or lies under one, an attention kernel this machine or dtype lacks; each is one
line, exit 2, and nothing is created."""

import pytest

from jaxrl.io.build import attention_kernel
from jaxrl.cli import main
from jaxrl.config import ModelConfig
from jaxrl.errors import ConfigError
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


@pytest.mark.parametrize("dtype,message", [
    ("bfloat16", "model.attention: 'cudnn' needs a GPU; this process runs JAX on 'cpu' (allowed here: auto, xla)"),
    ("float32", "cuDNN flash attention has no float32 kernel: set model.dtype: bfloat16, or model.attention: xla"),
])
def test_cudnn_attention_where_it_cannot_run(tmp_path, capsys, dtype, message):
    cfg = T.write_config(tmp_path)
    argv = ["train", str(cfg), "--run-dir", str(tmp_path / "run"), "--set", "model.attention=cudnn",
            "--set", f"model.dtype={dtype}"]
    assert main(argv) == 2
    assert message in _one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_auto_attention_picks_cudnn_on_a_gpu_in_bfloat16_only():
    pick = lambda dtype, backend, attention="auto", devices=1: attention_kernel(  # noqa: E731
        ModelConfig(dtype=dtype, attention=attention), backend, devices)
    assert pick("bfloat16", "gpu") == "cudnn"
    assert pick("float32", "gpu") == "xla"  # no float32 flash kernel
    assert pick("bfloat16", "cpu") == pick("bfloat16", "tpu") == "xla"
    assert pick("bfloat16", "gpu", "xla") == "xla"
    assert pick("bfloat16", "tpu", "splash") == "splash"
    with pytest.raises(ConfigError, match="'splash' needs a TPU; this process runs JAX on 'gpu'"):
        pick("bfloat16", "gpu", "splash")
    with pytest.raises(ConfigError, match="'splash' runs on one device until it is wrapped in shard_map; this "
                                          "run has 8 devices"):
        pick("bfloat16", "tpu", "splash", devices=8)
    with pytest.raises(ConfigError, match="allowed values|allowed"):
        ModelConfig(attention="flash")
