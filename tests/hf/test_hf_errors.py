"""Bad HF input: each failure is a CheckpointError naming the file/tensor (and shapes); outputs stay clean."""

import json

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxrl.io import hf
from jaxrl.errors import CheckpointError
from jaxrl.models import Transformer, TransformerConfig
from tests.hf._tiny_hf import make_tiny_hf


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "qwen3"
    make_tiny_hf("qwen3", path)
    return path


def _copy(src, dst, *, config=None, tensors=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config(cfg) if config else cfg))
    data = load_file(src / "model.safetensors")
    save_file(tensors(data) if tensors else data, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_missing_directory_config_and_weights(tmp_path, src):
    with pytest.raises(CheckpointError, match="HF checkpoint directory not found: .*nope"):
        hf.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json in HF checkpoint directory .*empty"):
        hf.from_pretrained(tmp_path / "empty")
    d = _copy(src, tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors or .* in .*noweights"):
        hf.from_pretrained(d)


def test_unknown_architecture(tmp_path, src):
    d = _copy(src, tmp_path / "gpt", config=lambda c: {**c, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(CheckpointError, match=r"gpt/config.json: unsupported architecture 'GPT2LMHeadModel'; "
                       r"supported: \['LlamaForCausalLM'"):
        hf.from_pretrained(d)


def test_missing_tensor(tmp_path, src):
    name = "model.layers.1.mlp.down_proj.weight"
    d = _copy(src, tmp_path / "missing", tensors=lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(CheckpointError, match=f"tensor '{name}' is missing from .*missing"):
        hf.from_pretrained(d)


def test_wrong_shape_names_tensor_file_and_shapes(tmp_path, src):
    name = "model.layers.0.self_attn.k_proj.weight"
    d = _copy(src, tmp_path / "shape", tensors=lambda t: {**t, name: np.zeros((16, 32), np.float32)})
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' in .*shape/model.safetensors has shape "
                       r"\(16, 32\), expected \(32, 32\)"):
        hf.from_pretrained(d)


def test_config_inconsistent_with_weights(tmp_path, src):
    d = _copy(src, tmp_path / "cfg", config=lambda c: {**c, "intermediate_size": 40})
    with pytest.raises(CheckpointError, match=r"mlp.gate_proj.weight' in .* has shape \(48, 32\), "
                       r"expected \(40, 32\)"):
        hf.from_pretrained(d)


def test_failed_save_leaves_output_clean(tmp_path, monkeypatch):
    model = Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0))

    class BrokenTokenizer:
        def save_pretrained(self, path):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        hf.save_pretrained(model, tmp_path / "out", tokenizer=BrokenTokenizer())
    assert list(tmp_path.iterdir()) == []
    hf.save_pretrained(model, tmp_path / "out")
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(CheckpointError, match="already exists and is not empty"):
        hf.save_pretrained(model, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_pre_norm_switches_the_family_cannot_express(tmp_path):
    model = Transformer(TransformerConfig.tiny(qk_norm=True), rngs=nnx.Rngs(0))  # family llama + qk_norm
    with pytest.raises(CheckpointError, match="family 'llama' in transformers has qkv_bias=False, qk_norm="):
        hf.save_pretrained(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
