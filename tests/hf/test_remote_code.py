"""Post-norm and SiameseNorm export: transformers loads our modeling file (trust_remote_code), same logits."""

import json

import numpy as np
import pytest
import torch
from flax import nnx

from jaxrl.io import hf
from jaxrl.models import Llama3RopeScaling, Transformer, TransformerConfig, set_params

TOKENS = np.array([[1, 7, 33, 12, 5, 60, 2, 9, 14, 3], [4, 4, 51, 8, 1, 0, 27, 63, 30, 11]])


def _randomise_norms_and_biases(model, seed=0):
    """Norm weights of 1 and zero biases would hide a mix-up between the many norms: randomise them."""
    params = nnx.state(model, nnx.Param).to_pure_dict()
    flat = {path: value for path, value in _flatten(params)}
    rng = np.random.default_rng(seed)
    changed = 0
    for path, value in flat.items():
        if "norm" in "/".join(path) or path[-1] == "bias":
            flat[path] = (1.0 if path[-1] == "weight" else 0.0) + 0.3 * rng.standard_normal(value.shape)
            changed += 1
    assert changed >= 3
    set_params(model, _unflatten(flat))


def _flatten(tree, prefix=()):
    for key, sub in tree.items():
        if isinstance(sub, dict):
            yield from _flatten(sub, prefix + (key,))
        else:
            yield prefix + (key,), sub


def _unflatten(flat):
    out = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


CASES = {
    "siamese_llama_tied": dict(norm="siamese", tie_embeddings=True, rope_theta=5000.0),
    "siamese_qwen3": dict(norm="siamese", qk_norm=True, family="qwen3", num_kv_heads=1, num_layers=3,
                          rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 16)),
    "post_qwen2": dict(norm="post", qkv_bias=True, family="qwen2", rope_theta=123456.0),
}


@pytest.mark.parametrize("case", [
    "siamese_llama_tied",
    pytest.param("siamese_qwen3", marks=pytest.mark.slow),  # ~30 s each on 2 shared cores (XLA compiles)
    pytest.param("post_qwen2", marks=pytest.mark.slow),
])
def test_remote_code_logits_match(tmp_path, case):
    from transformers import AutoModelForCausalLM

    model = Transformer(TransformerConfig.tiny(**CASES[case]), rngs=nnx.Rngs(1))
    _randomise_norms_and_biases(model)
    hf.save_pretrained(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["JaxrlForCausalLM"] and config["model_type"] == "jaxrl_decoder"
    assert config["norm"] == model.cfg.norm
    assert (tmp_path / "out" / "modeling_jaxrl.py").is_file()

    torch_model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=True,
                                                       dtype=torch.float32).eval()
    assert type(torch_model).__name__ == "JaxrlForCausalLM"
    mask = np.ones_like(TOKENS)
    mask[1, :4] = 0
    with torch.no_grad():
        want = torch_model(torch.tensor(TOKENS)).logits.numpy()
        want_padded = torch_model(torch.tensor(TOKENS), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(TOKENS)), want, atol=1e-4, rtol=0)
    ours_padded = np.asarray(model.forward(TOKENS, mask_BL=mask).logits)
    np.testing.assert_allclose(ours_padded[mask == 1], want_padded[mask == 1], atol=1e-4, rtol=0)

    # ... and our own loader reads the export back exactly.
    again = hf.from_pretrained(tmp_path / "out")
    assert again.cfg.norm == model.cfg.norm
    np.testing.assert_array_equal(np.asarray(again(TOKENS)), np.asarray(model(TOKENS)))
