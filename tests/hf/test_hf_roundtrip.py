"""HF <-> jaxrl: logits parity with transformers and exact round trips, for tiny random Llama/Qwen2/Qwen3."""

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from jaxrl.io import hf
from jaxrl.io._safetensors_dir import TensorReader
from tests.hf._tiny_hf import FAMILIES, make_tiny_hf

TOKENS = np.array([[1, 7, 33, 12, 5, 60, 2, 9, 14, 3], [4, 4, 51, 8, 1, 0, 27, 63, 30, 11]])


def _torch_logits(model, tokens, mask=None):
    with torch.no_grad():
        kwargs = {} if mask is None else {"attention_mask": torch.tensor(mask)}
        return model(torch.tensor(tokens), **kwargs).logits.numpy()


def _all_tensors(path):
    with TensorReader(path) as r:
        return {name: r.get(name) for name in r.names()}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_to_jaxrl_logits_and_round_trip(tmp_path, family):
    from transformers import AutoModelForCausalLM

    torch_model = make_tiny_hf(family, tmp_path / "src")
    model = hf.from_pretrained(tmp_path / "src")
    want = _torch_logits(torch_model, TOKENS)
    np.testing.assert_allclose(np.asarray(model(TOKENS)), want, atol=1e-4, rtol=0)

    hf.save_pretrained(model, tmp_path / "out")
    src, out = _all_tensors(tmp_path / "src"), _all_tensors(tmp_path / "out")
    assert sorted(src) == sorted(out)
    for name in src:
        np.testing.assert_array_equal(out[name], src[name], err_msg=name)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    src_config = json.loads((tmp_path / "src" / "config.json").read_text())
    assert config["architectures"] == src_config["architectures"]
    assert config["rope_parameters"] == src_config["rope_parameters"]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    np.testing.assert_array_equal(_torch_logits(reloaded, TOKENS), want)


def test_left_padded_batch_matches_transformers(tmp_path):
    """Padding as keys is masked; real tokens of a left-padded row match the unpadded row's logits."""
    torch_model = make_tiny_hf("qwen2", tmp_path / "src")
    model = hf.from_pretrained(tmp_path / "src")
    mask = np.ones_like(TOKENS)
    mask[1, :3] = 0
    ours = np.asarray(model.forward(TOKENS, mask_BL=mask).logits)
    position_ids = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        want = torch_model(torch.tensor(TOKENS), attention_mask=torch.tensor(mask),
                           position_ids=torch.tensor(position_ids)).logits.numpy()
    np.testing.assert_allclose(ours[mask == 1], want[mask == 1], atol=1e-4, rtol=0)
    alone = _torch_logits(torch_model, TOKENS[1:, 3:])
    np.testing.assert_allclose(ours[1, 3:], alone[0], atol=1e-4, rtol=0)


def test_sharded_checkpoint_read_and_write(tmp_path):
    torch_model = make_tiny_hf("qwen3", tmp_path / "src")
    torch_model.save_pretrained(tmp_path / "src_sharded", max_shard_size="20KB")
    assert (tmp_path / "src_sharded" / "model.safetensors.index.json").is_file()
    model = hf.from_pretrained(tmp_path / "src_sharded")
    want = _torch_logits(torch_model, TOKENS)
    np.testing.assert_allclose(np.asarray(model(TOKENS)), want, atol=1e-4, rtol=0)

    hf.save_pretrained(model, tmp_path / "out", max_shard_size="16KB")
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and all((tmp_path / "out" / f).stat().st_size < 16_000 + 8_192 for f in files)
    merged = {}
    for f in files:
        merged.update(load_file(tmp_path / "out" / f))
    src = _all_tensors(tmp_path / "src")
    assert sorted(merged) == sorted(src)
    for name in src:
        np.testing.assert_array_equal(merged[name], src[name], err_msg=name)
    again = hf.from_pretrained(tmp_path / "out")
    np.testing.assert_array_equal(np.asarray(again(TOKENS)), np.asarray(model(TOKENS)))


def test_bfloat16_load_and_save(tmp_path):
    make_tiny_hf("llama", tmp_path / "src")
    model = hf.from_pretrained(tmp_path / "src", dtype="bfloat16")
    assert model.cfg.param_dtype == "bfloat16"
    hf.save_pretrained(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    src, out = _all_tensors(tmp_path / "src"), _all_tensors(tmp_path / "out")
    name = "model.layers.1.mlp.up_proj.weight"
    assert out[name].dtype.name == "bfloat16"
    np.testing.assert_array_equal(out[name], src[name].astype(out[name].dtype))
