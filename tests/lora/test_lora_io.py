"""Adapter checkpoints (exact round trip, base hash check) and HF exports: merged model and PEFT adapter
loaded by transformers / peft give our logits within 1e-4; a PEFT adapter imports back exactly."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxrl.io import hf, lora_io, peft_io
from jaxrl.errors import CheckpointError
from jaxrl.models import Transformer
from jaxrl.models import lora

from tests.hf._tiny_hf import make_tiny_hf

TOKENS = np.random.default_rng(1).integers(3, 64, (2, 9))
LCFG = lora.LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _random_adapters(params, cfg, seed=0):
    adapters = lora.init_adapters(params, cfg, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 1), 64))
    return jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), adapters)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(HF dir, torch model, our params, model cfg, adapters) for a tiny random Llama."""
    path = tmp_path_factory.mktemp("hf") / "llama"
    torch_model = make_tiny_hf("llama", path)
    model = hf.from_pretrained(path)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    return path, torch_model, params, model.cfg, _random_adapters(params, LCFG)


@functools.partial(jax.jit, static_argnums=0)
def _logits(cfg, params):
    return Transformer.from_params(cfg, params)(jnp.asarray(TOKENS, jnp.int32))


def _ours(cfg, params):
    return np.asarray(_logits(cfg, params))


def test_adapter_checkpoint_roundtrip_is_exact_and_checks_the_base(tiny, tmp_path):
    path, _, params, _, adapters = tiny
    lora_io.save_adapters(tmp_path / "ad", adapters, LCFG, lora_io.base_ref(path, params))
    loaded, cfg = lora_io.load_adapters(tmp_path / "ad", params)
    assert cfg == LCFG
    for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(adapters)):
        np.testing.assert_array_equal(got, np.asarray(want))  # bit for bit: resume continues exactly
    other = jax.tree.map(lambda x: x, params)
    up = params["layers"]["mlp"]["up_proj"]["kernel"]
    other["layers"]["mlp"]["up_proj"]["kernel"] = up.at[0, 0, 0].add(1e-3)
    with pytest.raises(CheckpointError, match="trained on base .* hash to"):
        lora_io.load_adapters(tmp_path / "ad", other)
    with pytest.raises(CheckpointError, match="already exists"):
        lora_io.save_adapters(tmp_path / "ad", adapters, LCFG, lora_io.base_ref(path, params))
    with pytest.raises(CheckpointError, match="no lora_config.json"):
        lora_io.load_adapters(tmp_path, params)


def test_fingerprint_sees_every_value_and_ignores_exact_upcasts(tiny):
    _, _, params, _, _ = tiny
    h = lora_io.base_fingerprint(params)
    bf16 = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
    assert lora_io.base_fingerprint(bf16) == lora_io.base_fingerprint(jax.tree.map(
        lambda x: jnp.asarray(x, jnp.float32), bf16))
    assert lora_io.base_fingerprint(bf16) != h
    moved = jax.tree.map(lambda x: x, params)
    moved["norm"]["weight"] = params["norm"]["weight"].at[3].multiply(-1.0)
    assert lora_io.base_fingerprint(moved) != h


def test_merged_export_loads_in_transformers_within_1e4(tiny, tmp_path):
    import transformers

    path, _, params, cfg, adapters = tiny
    lora_io.export_merged(cfg, params, adapters, LCFG, tmp_path / "merged")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        ref = theirs(torch.tensor(TOKENS)).logits.numpy()
    ours = _ours(cfg, lora.merge(params, adapters, LCFG))
    assert np.abs(ours - _ours(cfg, params)).max() > 0.05  # the adapters matter
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_peft_export_loads_in_peft_and_imports_back(tiny, tmp_path):
    import peft
    import transformers

    path, _, params, cfg, adapters = tiny
    peft_io.export_peft(adapters, LCFG, tmp_path / "peft", base_model=str(path))
    base = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    peft_model = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    with torch.no_grad():
        ref = peft_model(torch.tensor(TOKENS)).logits.numpy()
    ours = _ours(cfg, lora.merge(params, adapters, LCFG))
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
    back, cfg_back, notes = peft_io.import_peft(tmp_path / "peft", params)
    assert cfg_back == LCFG and notes == []
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(adapters)):
        np.testing.assert_array_equal(got, np.asarray(want))  # transposes and reshapes only


def test_peft_import_of_peft_made_adapter(tiny, tmp_path):
    """An adapter made and saved by peft itself (random B, dropout 0.1) imports with our logits = peft's."""
    import peft
    import transformers

    path, _, params, cfg, _ = tiny
    base = transformers.AutoModelForCausalLM.from_pretrained(path)
    config = peft.LoraConfig(r=2, lora_alpha=6, lora_dropout=0.1, target_modules=["k_proj", "up_proj"])
    model = peft.get_peft_model(base, config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "theirs")
    model.eval()
    with torch.no_grad():
        ref = model(torch.tensor(TOKENS)).logits.numpy()
    adapters, lcfg, notes = peft_io.import_peft(tmp_path / "theirs", params)
    assert lcfg == lora.LoraConfig(rank=2, alpha=6.0, targets=("k_proj", "up_proj"))
    assert len(notes) == 1 and "lora_dropout=0.1" in notes[0]
    np.testing.assert_allclose(_ours(cfg, lora.merge(params, adapters, lcfg)), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("key, value", [("use_dora", True), ("use_rslora", True), ("bias", "all"),
                                        ("modules_to_save", ["lm_head"])])
def test_peft_import_refuses_options_we_do_not_implement(tiny, tmp_path, key, value):
    _, _, params, _, adapters = tiny
    peft_io.export_peft(adapters, LCFG, tmp_path / "p", base_model="x")
    file = tmp_path / "p" / "adapter_config.json"
    config = json.loads(file.read_text())
    config[key] = value
    file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"{key}=.* is not supported"):
        peft_io.import_peft(tmp_path / "p", params)
