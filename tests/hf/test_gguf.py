"""The GGUF -> HF conversion: the cached SmolLM2 directory is a normal, complete, float32 HF checkpoint."""

import json

import numpy as np
import pytest
from safetensors import safe_open

from jaxrl.errors import CheckpointError
from jaxrl.io.gguf import gguf_to_hf_dir


def test_smollm2_dir_is_a_plain_llama_checkpoint(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in cfg
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (576, 30, 3)
    assert (smollm2_dir / "tokenizer.json").is_file()
    with safe_open(smollm2_dir / "model.safetensors", "np") as f:
        names = set(f.keys())
        emb = f.get_tensor("model.embed_tokens.weight")
        up = f.get_tensor("model.layers.3.mlp.up_proj.weight")
    assert emb.dtype == np.float32 and emb.shape == (49152, 576)
    assert len(names) == 2 + 9 * 30  # embed + final norm + 9 tensors per layer; lm_head is tied
    # Dequantised Q4_1 weights hold at most 16 distinct values per 32-wide block: it came from the GGUF.
    assert all(len(np.unique(up[r, :32])) <= 16 for r in range(8))
    assert len(np.unique(up[0, :64])) > 16


def test_smollm2_tokenizer_chat_template(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"


def test_gguf_errors(tmp_path):
    with pytest.raises(CheckpointError, match="GGUF file not found"):
        gguf_to_hf_dir(tmp_path / "nope.gguf", tmp_path / "out")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="bad.gguf"):
        gguf_to_hf_dir(bad, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]  # no temp dir left behind
