"""SiameseNorm hybrid-pre export: transformers loads our modeling file (trust_remote_code), same logits as JAX.

Also an upcycled model (pre-norm weights, zeroed x-stream gains) exports and loads like any SiameseNorm model.
"""

import json

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from jaxrl.io import hf
from jaxrl.models import Transformer, TransformerConfig, set_params
from jaxrl.models.upcycle import siamese_from_prenorm

TOKENS = np.array([[1, 7, 33, 12, 5, 60, 2, 9, 14, 3], [4, 4, 51, 8, 1, 0, 27, 63, 30, 11]])


def _random_norms(model, seed=0):
    """Each norm weight its own 1 ± 0.3 draw, biases N(0, 0.3²): a norm mix-up in the export would show."""
    rng = np.random.default_rng(seed)

    def draw(path, a):
        key = jax.tree_util.keystr(path)
        if "norm" in key:
            return (1.0 + 0.3 * rng.standard_normal(a.shape)).astype(np.float32)
        if "bias" in key:
            return (0.3 * rng.standard_normal(a.shape)).astype(np.float32)
        return np.asarray(a)

    set_params(model, jax.tree_util.tree_map_with_path(draw, nnx.state(model, nnx.Param).to_pure_dict()))
    return model


def _check_export(model, out_dir):
    from transformers import AutoModelForCausalLM

    hf.save_pretrained(model, out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    assert config["architectures"] == ["JaxrlForCausalLM"] and config["norm"] == model.cfg.norm
    torch_model = AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True,
                                                       dtype=torch.float32).eval()
    assert type(torch_model.model.layers[0].siamese).__name__ == {
        "siamese": "JaxrlSiameseNorms", "siamese_hybrid": "JaxrlSiameseHybridNorms"}[model.cfg.norm]
    mask = np.ones_like(TOKENS)
    mask[1, :4] = 0
    with torch.no_grad():
        want = torch_model(torch.tensor(TOKENS)).logits.numpy()
        want_padded = torch_model(torch.tensor(TOKENS), attention_mask=torch.tensor(mask)).logits.numpy()
    ours = np.asarray(model(TOKENS))
    assert np.max(np.abs(ours)) > 0.1
    np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
    ours_padded = np.asarray(model.forward(TOKENS, mask_BL=mask).logits)
    np.testing.assert_allclose(ours_padded[mask == 1], want_padded[mask == 1], atol=1e-4, rtol=0)
    again = hf.from_pretrained(out_dir)
    assert again.cfg.norm == model.cfg.norm
    np.testing.assert_array_equal(np.asarray(again(TOKENS)), ours)
    return want


@pytest.mark.parametrize("overrides", [
    dict(family="qwen3", qk_norm=True, num_layers=3),
    pytest.param(dict(tie_embeddings=True, rope_theta=5000.0), marks=pytest.mark.slow),  # no QK-norm
])
def test_hybrid_export_logits_match(tmp_path, overrides):
    model = Transformer(TransformerConfig.tiny(norm="siamese_hybrid", **overrides), rngs=nnx.Rngs(1))
    _check_export(_random_norms(model), tmp_path / "out")


def test_upcycled_hybrid_exports(tmp_path):
    source = _random_norms(Transformer(TransformerConfig.tiny(family="qwen2", qkv_bias=True), rngs=nnx.Rngs(2)))
    want = _check_export(siamese_from_prenorm(source, "siamese_hybrid"), tmp_path / "up")
    # torch's logits of the upcycled model are the pre-norm source's up to the double-norm factor (≈ 1e-3 here).
    np.testing.assert_allclose(want, np.asarray(source(TOKENS)), atol=5e-3 * np.max(np.abs(want)), rtol=0)
