"""A LoRA run directory works wherever RUN/adapters does (issue 30 item 5): `export-hf --checkpoint RUN` (the
README's preset-base run records no base path: the base is rebuilt from the run's config.yaml and checked
against the recorded fingerprint), `sample` and `eval` merge the adapters on the fly; where the base cannot be
known, or a checkpoint directory of a LoRA run is named, one line saying what to pass."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.io import build
from jaxrl.io import hf, lora_io, peft_io
from jaxrl.cli import main
from jaxrl.config import dump_config, load_config
from jaxrl.models import Transformer, lora

SMALL = ["model.overrides={hidden_size: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2, head_dim: 16, "
         "mlp_dim: 64}", "model.lora={rank: 2, alpha: 4.0}", "rollout.max_new_tokens=4",
         "rollout.gen_buckets=[8]", "data.eval_size=2"]
TOKENS = np.array([[1, 7, 33, 12, 5, 60, 2, 9]])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """RUN as `jaxrl train` leaves it for a preset base (config.yaml, RUN/adapters with path ""), adapters
    moved off zero; returns (RUN, logits of base + adapters merged)."""
    run = tmp_path_factory.mktemp("lora") / "run"
    cfg = load_config(None, SMALL)
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg))
    tok = build.build_tokenizer(cfg.model, cfg.tokenizer)
    params = nnx.state(build.build_model(cfg.model, vocab_size=len(tok), seed=cfg.train.seed),
                       nnx.Param).to_pure_dict()
    ad = lora.init_adapters(params, cfg.model.lora, jax.random.key(3))
    ad = jax.tree.map(lambda x: x + 0.1 * jnp.cos(jnp.arange(x.size).reshape(x.shape)), ad)
    ref = {"path": "", "sha256": lora_io.base_fingerprint(params)}  # what the trainer records today
    lora_io.save_adapters(run / "adapters", ad, cfg.model.lora, ref)
    model = Transformer.from_params(build.preset_config(cfg.model, len(tok)),
                                    lora.merge(params, ad, cfg.model.lora))
    return run, np.asarray(model(TOKENS))


def test_export_a_lora_run_with_a_preset_base(run, tmp_path, capsys):
    run_dir, want = run
    assert main(["export-hf", "--checkpoint", str(run_dir), "--out", str(tmp_path / "m")]) == 0, \
        capsys.readouterr().err
    exported = hf.from_pretrained(tmp_path / "m")
    np.testing.assert_allclose(np.asarray(exported(TOKENS)), want, atol=1e-5, rtol=0)
    model, _ = lora_io.merged_model(run_dir)
    np.testing.assert_allclose(np.asarray(model(TOKENS)), want, atol=1e-5, rtol=0)
    # the README's form, RUN/adapters --peft: was ". is not a jaxrl checkpoint" (the empty base path)
    assert main(["export-hf", "--checkpoint", str(run_dir / "adapters"), "--peft", "--out",
                 str(tmp_path / "p")]) == 0, capsys.readouterr().err
    assert (tmp_path / "p" / peft_io.PEFT_WEIGHTS).is_file()


def test_sample_and_eval_merge_a_lora_run_on_the_fly(run, capsys):
    run_dir, _ = run
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "1+1=", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0, capsys.readouterr().err
    assert "=== prompt 0 sample 0" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", str(run_dir), "--limit", "2", "--batch-size", "2"]) == 0, \
        capsys.readouterr().err
    assert '"num_prompts": 2' in capsys.readouterr().out


def test_what_cannot_be_resolved_is_one_line(run, tmp_path, capsys):
    run_dir, _ = run
    shutil.copytree(run_dir / "adapters", tmp_path / "alone")  # no config.yaml beside: the base is unknown
    assert main(["export-hf", "--checkpoint", str(tmp_path / "alone"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pass --base" in err, err
    (run_dir / "checkpoints" / "5").mkdir(parents=True)  # an orbax step directory holds adapters only
    assert main(["sample", "--checkpoint", str(run_dir / "checkpoints" / "5"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--checkpoint {run_dir}" in err, err


def test_a_run_trained_with_cudnn_attention_exports_on_a_cpu(run, tmp_path):
    """The attention kernel of the run's config (cuDNN on its GPU) changes no parameter: rebuilding the preset
    base here picks this machine's kernel instead of refusing the config."""
    run_dir, _ = run
    gpu_run = tmp_path / "gpu_run"
    shutil.copytree(run_dir, gpu_run)
    cfg = load_config(gpu_run / "config.yaml", ["model.attention=cudnn", "model.dtype=bfloat16"])
    (gpu_run / "config.yaml").write_text(dump_config(cfg))
    model, _ = lora_io.merged_model(gpu_run)  # the base fingerprint still matches
    assert model.cfg.attention == "xla"
