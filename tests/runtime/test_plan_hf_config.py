"""`jaxrl plan` needs a model's shapes only: an HF `config.json` alone (no weights) is enough (issue 14)."""

from __future__ import annotations


import pytest
from flax import nnx

from jaxrl import cli
from jaxrl.io import hf
from jaxrl.commands import plan as plan_cmd
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.plan.memory import plan_memory
from jaxrl.sharding import MeshConfig

SHAPE = dict(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64,
             family="llama", tie_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
YAML = ("model: {{preset: null, hf_path: {path}, dtype: float32, remat: none}}\n"
        "data: {{prompts_per_step: 2}}\n"
        "rollout: {{group_size: 4, max_new_tokens: 8, prompt_buckets: [8, 16]}}\n"
        "mesh: {{data: 1, fsdp: -1, tensor: 1}}\n")


@pytest.fixture(scope="module")
def config_only_dir(tmp_path_factory):
    """An HF directory of the SHAPE model with its weights deleted: config.json (and tokenizer files) only."""
    out = tmp_path_factory.mktemp("hf") / "model"
    hf.save_pretrained(Transformer(TransformerConfig(**SHAPE), rngs=nnx.Rngs(0)), out)
    for weights in out.glob("*.safetensors*"):
        weights.unlink()
    assert (out / "config.json").is_file() and not list(out.glob("*.safetensors"))
    return out


def _expected_plan(devices: int = 4):
    cfg = TransformerConfig(**SHAPE)
    return plan_memory(cfg, MeshConfig(data=1, fsdp=-1, tensor=1), devices, batch=8, seq_len=24,
                       rollout_batch=8, rollout_len=24, remat="none", accelerator="v5e")


def test_plan_from_config_json_alone(tmp_path, config_only_dir, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(YAML.format(path=config_only_dir))
    assert cli.main(["plan", str(cfg), "--devices", "4", "--accelerator", "v5e"]) == 0
    out = capsys.readouterr().out
    assert _expected_plan().table() in out


def test_hf_config_flag_replaces_a_missing_model_dir(tmp_path, config_only_dir, capsys):
    renamed = tmp_path / "qwen_like.json"  # any file name, anywhere
    renamed.write_text((config_only_dir / "config.json").read_text())
    cfg = tmp_path / "c.yaml"
    cfg.write_text(YAML.format(path=tmp_path / "not_downloaded"))
    for source in (renamed, config_only_dir):
        assert cli.main(["plan", str(cfg), "--devices", "4", "--accelerator", "v5e",
                         "--hf-config", str(source)]) == 0
        assert _expected_plan().table() in capsys.readouterr().out


def test_missing_config_json_is_one_clear_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(YAML.format(path=tmp_path / "not_downloaded"))
    assert cli.main(["plan", str(cfg), "--devices", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no config.json in" in err and "--hf-config" in err and "qwen3_8b" in err
    assert cli.main(["plan", str(cfg), "--devices", "4", "--hf-config", str(tmp_path / "nope.json")]) == 2
    assert "--hf-config" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli.main(["plan", str(cfg), "--devices", "4", "--hf-config", str(bad)]) == 2
    assert "not a supported HF model config" in capsys.readouterr().err


def test_model_config_keeps_the_sections_overrides(config_only_dir):
    from jaxrl.config import ModelConfig

    section = ModelConfig(preset=None, hf_path=str(config_only_dir / "elsewhere"),
                          overrides={"num_layers": 1})
    resolved = plan_cmd.model_config(section, str(config_only_dir / "config.json"))
    assert resolved.num_layers == 1 and resolved.hidden_size == SHAPE["hidden_size"]
