"""`jaxrl export-hf --merge|--peft` of an adapter checkpoint and `jaxrl import-hf --peft DIR --hf BASE`."""

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from jaxrl import hf, lora_io
from jaxrl.cli import main
from jaxrl.models import Transformer, lora
from tests.hf._tiny_hf import make_tiny_hf

TOKENS = np.array([[1, 7, 33, 12, 5, 60, 2, 9]])
LCFG = lora.LoraConfig(rank=2, alpha=3.0, targets=("q_proj", "k_proj", "up_proj"))


def test_export_merge_peft_and_import_back(tmp_path, capsys):
    import peft
    import transformers

    make_tiny_hf("qwen3", tmp_path / "base")
    model = hf.from_pretrained(tmp_path / "base")
    params = nnx.state(model, nnx.Param).to_pure_dict()
    ad = lora.init_adapters(params, LCFG, jax.random.key(0))
    ad = jax.tree.map(lambda x: x + 0.3 * jnp.sign(jnp.sin(jnp.arange(x.size).reshape(x.shape) + 1.0)), ad)
    lora_io.save_adapters(tmp_path / "ad", ad, LCFG, lora_io.base_ref(tmp_path / "base", params))
    ours = np.asarray(Transformer.from_params(model.cfg, lora.merge(params, ad, LCFG))(TOKENS))

    export = ["export-hf", "--checkpoint", str(tmp_path / "ad"), "--out"]
    assert main(export + [str(tmp_path / "m"), "--merge"]) == 0
    merged = np.asarray(hf.from_pretrained(tmp_path / "m")(TOKENS))
    np.testing.assert_allclose(merged, ours, atol=1e-5, rtol=0)

    assert main(export + [str(tmp_path / "p"), "--peft"]) == 0
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    with torch.no_grad():
        peft_model = peft.PeftModel.from_pretrained(base, tmp_path / "p").eval()
        theirs = peft_model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)

    assert main(["import-hf", "--peft", str(tmp_path / "p"), "--hf", str(tmp_path / "base"),
                 "--out", str(tmp_path / "b")]) == 0
    back, cfg = lora_io.load_adapters(tmp_path / "b", params)
    assert cfg == LCFG
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(ad)):
        np.testing.assert_array_equal(got, np.asarray(want))


def test_wrong_base_and_missing_hf_are_one_line_errors(tmp_path, capsys):
    make_tiny_hf("llama", tmp_path / "base", seed=0)
    make_tiny_hf("llama", tmp_path / "other", seed=1)
    params = nnx.state(hf.from_pretrained(tmp_path / "base"), nnx.Param).to_pure_dict()
    ad = lora.init_adapters(params, LCFG, jax.random.key(0))
    lora_io.save_adapters(tmp_path / "ad", ad, LCFG, lora_io.base_ref(tmp_path / "base", params))
    capsys.readouterr()
    argv = ["export-hf", "--checkpoint", str(tmp_path / "ad"), "--out", str(tmp_path / "x"), "--peft",
            "--base", str(tmp_path / "other")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "trained on base" in err and "Traceback" not in err and not (tmp_path / "x").exists()
    argv = ["import-hf", "--peft", str(tmp_path / "p"), "--gguf", "f.gguf", "--out", str(tmp_path / "y")]
    assert main(argv) == 2
    assert "--peft needs --hf" in capsys.readouterr().err
