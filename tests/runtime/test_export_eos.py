"""Exports stop at EOS: bos/eos/pad ids of config.json and generation_config.json are the tokenizer's, so
transformers' greedy `generate` on an exported directory stops where `jaxrl sample` stops, with the same
tokens.

Two exports: the quickstart's kind (a `tiny` preset, whose TransformerConfig says eos=2, with the built-in
tokenizer, whose end token is 1) and a Llama import whose tokenizer's eos differs from its config's. Random
weights rarely emit EOS, so the exported `lm_head` row of EOS is set to 1.01 x the row of the token greedy
decoding emits third: EOS then wins exactly where that token would have (a logit > 0 grows), mid-sequence.
"""

import json
import re

import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxrl.io import model_io
from jaxrl.cli import main
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.io.tokenizer import builtin_tokenizer
from tests.hf._tiny_hf import make_tiny_hf

transformers = pytest.importorskip("transformers")
PROMPT = "12+3="
MAX_NEW = 12


def _jaxrl_sample(hf_dir, capsys) -> tuple[str, int, bool]:
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(hf_dir), "--prompt", PROMPT, "--temperature", "0",
                 "--max-new-tokens", str(MAX_NEW)]) == 0
    header, *text = capsys.readouterr().out.split("\n", 1)
    n, end = re.search(r"\((\d+) tokens, (eos|max length)\)", header).groups()
    return (text[0] if text else "").rstrip("\n"), int(n), end == "eos"


def _hf_generate(hf_dir, tok) -> tuple[str, int, bool]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                             do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    stopped = bool(new) and new[-1] in eos
    return tok.decode(new, skip_special_tokens=True), len(new), stopped


def _plant_eos(hf_dir, eos_id: int) -> None:
    """Makes EOS the greedy choice where the third generated token would have been."""
    tok = model_io.load_tokenizer(hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    with torch.no_grad():
        new = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                             eos_token_id=None)[0, ids.shape[1]:].tolist()
    target = new[2]
    file = hf_dir / "model.safetensors"
    tensors = load_file(str(file))
    head = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    tensors[head] = tensors[head].copy()
    tensors[head][eos_id] = 1.01 * tensors[head][target]
    save_file(tensors, str(file), metadata={"format": "pt"})


def _assert_same_stop(hf_dir, eos_id: int, capsys):
    _plant_eos(hf_dir, eos_id)
    tok = model_io.load_tokenizer(hf_dir)
    ours = _jaxrl_sample(hf_dir, capsys)
    theirs = _hf_generate(hf_dir, tok)
    assert ours[2], ours  # jaxrl stopped at EOS, before max length ...
    assert 2 <= ours[1] < MAX_NEW
    assert theirs == ours  # ... and transformers stops at the same token with the same text


def test_quickstart_style_export_stops_at_builtin_eos(tmp_path, capsys):
    tok = builtin_tokenizer()
    model = Transformer(TransformerConfig.tiny(vocab_size=len(tok)), rngs=nnx.Rngs(3))
    assert model.cfg.eos_token_id == 2 and tok.eos_token_id == 1  # the mismatch the export must not copy
    model_io.save_model_checkpoint(model, tmp_path / "ckpt", tokenizer=tok)
    assert main(["export-hf", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (1, 0, None)
    assert generation == {"eos_token_id": 1, "pad_token_id": 0}
    _assert_same_stop(tmp_path / "hf", 1, capsys)


def _word_tokenizer(path, eos: str):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(60)} | {ch: 60 + i for i, ch in enumerate("123=")}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eos, pad_token="w0").save_pretrained(path)


def test_llama_export_stops_at_tokenizer_eos(tmp_path, capsys):
    make_tiny_hf("llama", tmp_path / "src")  # config.json says eos_token_id=2
    _word_tokenizer(tmp_path / "src", eos="w5")
    assert main(["import-hf", "--hf", str(tmp_path / "src"), "--out", str(tmp_path / "ckpt")]) == 0
    assert json.loads((tmp_path / "ckpt" / "model_config.json").read_text())["eos_token_id"] == 5
    assert main(["export-hf", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["eos_token_id"] == 5
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["eos_token_id"] == 5
    _assert_same_stop(tmp_path / "hf", 5, capsys)


def test_multi_eos_config_keeps_its_other_ids():
    class Tok:
        bos_token_id, eos_token_id, pad_token_id = None, 7, 0

    assert model_io.token_ids(Tok(), (3, 7, 9)) == {"bos_token_id": None, "eos_token_id": (7, 3, 9),
                                                    "pad_token_id": 0}
    assert model_io.token_ids(Tok(), 2)["eos_token_id"] == 7
    np.testing.assert_equal(model_io.token_ids(Tok(), None)["eos_token_id"], 7)
