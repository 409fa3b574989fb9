"""`jaxrl import-hf` / `jaxrl export-hf` through `jaxrl.cli.main`: round trip and one-line user errors."""

import json

import numpy as np
import pytest

from jaxrl.io import hf, model_io
from jaxrl.cli import main
from tests.hf._tiny_hf import make_tiny_hf

TOKENS = np.array([[1, 7, 33, 12, 5, 60, 2, 9]])


def _add_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(64)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="w2", pad_token="w0").save_pretrained(path)


def test_import_export_round_trip(tmp_path, capsys):
    make_tiny_hf("qwen2", tmp_path / "src")
    _add_tokenizer(tmp_path / "src")
    assert main(["import-hf", "--hf", str(tmp_path / "src"), "--out", str(tmp_path / "ckpt")]) == 0
    written = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert written == ["model_config.json", "params", "tokenizer"]
    assert main(["export-hf", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")]) == 0
    assert "wrote HF directory" in capsys.readouterr().out

    src, out = hf.from_pretrained(tmp_path / "src"), hf.from_pretrained(tmp_path / "out")
    np.testing.assert_array_equal(np.asarray(out(TOKENS)), np.asarray(src(TOKENS)))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    model, tok = model_io.load_model(tmp_path / "out")
    assert model.cfg.qkv_bias and tok.eos_token == "w2"
    vocab = lambda d: json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]  # noqa: E731
    assert vocab(tmp_path / "out") == vocab(tmp_path / "src") == {f"w{i}": i for i in range(64)}


def test_import_bfloat16(tmp_path):
    make_tiny_hf("llama", tmp_path / "src")
    assert main(["import-hf", "--hf", str(tmp_path / "src"), "--out", str(tmp_path / "ckpt"),
                 "--dtype", "bfloat16"]) == 0
    cfg = json.loads((tmp_path / "ckpt" / "model_config.json").read_text())
    assert cfg["param_dtype"] == "bfloat16" and cfg["dtype"] == "bfloat16"


@pytest.mark.parametrize("argv,message", [
    (["import-hf", "--hf", "{tmp}/nope", "--out", "{tmp}/ckpt"], "--hf {tmp}/nope: not a directory"),
    (["import-hf", "--hf", "{tmp}", "--out", "{tmp}/ckpt"], "no config.json in HF checkpoint directory"),
    (["import-hf", "--gguf", "{tmp}/x.gguf", "--out", "{tmp}/ckpt"], "GGUF file not found: {tmp}/x.gguf"),
    (["export-hf", "--checkpoint", "{tmp}/nope", "--out", "{tmp}/o"], "--checkpoint {tmp}/nope: no such"),
    (["export-hf", "--checkpoint", "{tmp}", "--out", "{tmp}/o"], "{tmp} is not a jaxrl checkpoint"),
])
def test_user_errors_exit_2_with_one_line(tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(tmp=tmp_path) in err
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "o").exists()


def test_own_siamese_export_tokenizer_loads_without_remote_code_prompt(tmp_path, monkeypatch):
    """Our SiameseNorm exports name custom code in config.json; jaxrl reads their tokenizer with
    trust_remote_code=False and never asks (transformers used to prompt "Do you wish to run the custom
    code?")."""
    import builtins

    import transformers
    from flax import nnx

    from jaxrl.models import Transformer, TransformerConfig
    from jaxrl.io.tokenizer import builtin_tokenizer

    tok = builtin_tokenizer()
    model = Transformer(TransformerConfig.tiny(vocab_size=len(tok), norm="siamese", num_layers=1),
                        rngs=nnx.Rngs(0))
    hf.save_pretrained(model, tmp_path / "out", tokenizer=tok)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["auto_map"]

    def no_prompt(*a, **k):
        raise AssertionError("interactive prompt")

    monkeypatch.setattr(builtins, "input", no_prompt)
    seen = []
    real = transformers.AutoTokenizer.from_pretrained

    def spy(*a, **k):
        seen.append(k)
        return real(*a, **k)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    loaded = model_io.load_tokenizer(tmp_path / "out")
    assert loaded.eos_token_id == 1 and loaded("1+2")["input_ids"] == tok("1+2")["input_ids"]
    assert seen and all(k.get("trust_remote_code") is False and k.get("local_files_only") for k in seen)
    model2, tok2 = model_io.load_model(tmp_path / "out")  # our own code for the weights, too
    assert model2.cfg.norm == "siamese" and tok2.eos_token_id == 1
