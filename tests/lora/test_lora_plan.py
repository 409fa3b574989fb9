"""`jaxrl plan` with `model.lora` / `model.quantize`: per-device bytes counted by hand on the tiny model."""

from __future__ import annotations

import dataclasses

from jaxrl import cli
from jaxrl.commands import plan as plan_cmd
from jaxrl.config import load_config
from jaxrl.models import TransformerConfig, lora
from jaxrl.plan.memory import plan_memory
from jaxrl.sharding import MeshConfig

# Tiny: D 32, N 4, K 2, H 8, F 64, Y 2, V 64, untied head, float32 weights.
KERNELS = 1024 + 512 + 512 + 1024 + 3 * 2048  # q, k, v, o, gate, up, down elements of one layer
REST = 2 * 64 + 2 * 2048 + 32  # two norms per layer (×2 layers), embedding + head, final norm
ADAPTER_R2 = 128 + 96 + 96 + 128 + 192 + 192 + 192  # r·(in + out) per layer at r = 2
ROWS = 32 + 16 + 16 + 32 + 64 + 64 + 32  # output rows of the seven projections (one scale each)


def _plans(devices: int, fsdp: int):
    cfg = TransformerConfig.tiny()
    mesh = MeshConfig(data=1, fsdp=fsdp, tensor=1)
    dense = plan_memory(cfg, mesh, devices, batch=8, seq_len=24, rollout_batch=8, rollout_len=24,
                        remat="none", accelerator="v5e")
    return cfg, mesh, dense


def test_one_device_lora_int8_nf4_by_hand():
    cfg, mesh, dense = _plans(1, 1)
    assert dense.params == 4 * (2 * KERNELS + REST)
    merged_all = 4 * 2 * KERNELS  # W' of the seven projections, float32, both layers
    adapters = 4 * 2 * ADAPTER_R2
    lcfg = lora.LoraConfig(rank=2)

    plan, parts = plan_cmd.lora_plan(dense, cfg, lcfg, "none", mesh, 1)
    assert parts == {"base": dense.params, "adapters": adapters, "merged": merged_all,
                     "merged_cotangent": merged_all}
    assert plan.params == dense.params + adapters + merged_all
    assert plan.optimizer == 2 * adapters < dense.optimizer  # AdamW moments of the adapters only
    assert plan.gradients == adapters + merged_all
    assert (plan.activations, plan.kv_cache) == (dense.activations, dense.kv_cache)

    int8, parts8 = plan_cmd.lora_plan(dense, cfg, lcfg, "int8", mesh, 1)
    base8 = 2 * (KERNELS + 4 * ROWS) + 4 * REST  # 1 byte per weight + a float32 scale per row
    assert parts8["base"] == base8
    assert parts8["base"] == lora.lora_memory(cfg, lcfg, base_bits="int8")["base"]
    assert int8.params == base8 + adapters + merged_all

    # nf4 on q_proj only: the base is quantised whole (½ byte + one float32 absmax per 64 inputs of a row:
    # one block per row here) and dequantised whole by merge; the cotangent and adapters are q_proj's.
    q_only = lora.LoraConfig(rank=2, targets=("q_proj",))
    nf4, parts4 = plan_cmd.lora_plan(dense, cfg, q_only, "nf4", mesh, 1)
    base4 = 2 * (KERNELS // 2 + 4 * ROWS) + 4 * REST
    assert parts4 == {"base": base4, "adapters": 4 * 2 * 128, "merged": merged_all,
                      "merged_cotangent": 4 * 2 * 1024}
    assert (nf4.optimizer, nf4.gradients) == (2 * 4 * 2 * 128, 4 * 2 * 128 + 4 * 2 * 1024)


def test_fsdp_splits_embed_side_of_adapters_and_kernels():
    cfg, mesh, dense = _plans(2, 2)  # FSDP rules: only `embed` (and vocab) split over the two devices
    # per layer, embed side halved: q 32+64, k 32+32, v 32+32, o 64+32, gate/up 32+128, down 128+32
    adapters = 4 * 2 * (96 + 64 + 64 + 96 + 160 + 160 + 160)
    plan, parts = plan_cmd.lora_plan(dense, cfg, lora.LoraConfig(rank=2), "int8", mesh, 2)
    assert parts["adapters"] == adapters
    assert parts["merged"] == parts["merged_cotangent"] == 4 * 2 * KERNELS // 2
    # every projection has one embed axis: its float32 kernel and its int8 codes are halved (the scales are
    # counted in the same proportion: `lora_plan` documents it as approximate for them)
    assert parts["base"] == dense.params - 4 * 2 * KERNELS // 2 + 2 * (KERNELS + 4 * ROWS) // 2
    assert plan.optimizer == 2 * adapters


def test_cli_lora_has_no_reference_copy(tmp_path, capsys):
    yaml = ("model: {preset: tiny, dtype: float32, remat: none%s}\n"
            "data: {prompts_per_step: 2}\n"
            "rollout: {group_size: 4, max_new_tokens: 8, prompt_buckets: [8, 16]}\n"
            "algorithm: {kl: {beta: 0.05}}\n"
            "mesh: {data: 1, fsdp: -1, tensor: 1}\n")
    dense_yaml, lora_yaml = tmp_path / "dense.yaml", tmp_path / "lora.yaml"
    dense_yaml.write_text(yaml % "")
    lora_yaml.write_text(yaml % ", lora: {rank: 2, alpha: 4}, quantize: nf4")
    assert cli.main(["plan", str(dense_yaml), "--devices", "1"]) == 0
    dense_out = capsys.readouterr().out
    assert "reference model" in dense_out
    assert cli.main(["plan", str(lora_yaml), "--devices", "1"]) == 0
    out = capsys.readouterr().out
    assert "reference model" not in out and "base (nf4)" in out

    cfg = load_config(str(lora_yaml), [])
    model_cfg = plan_cmd.model_config(cfg.model)
    dense = plan_memory(model_cfg, cfg.mesh, 1, batch=8, seq_len=24, rollout_batch=8, rollout_len=24)
    expected, _ = plan_cmd.lora_plan(dense, model_cfg, cfg.model.lora, "nf4", cfg.mesh, 1)
    assert expected.table() in out
    with_ref = dataclasses.replace(dense, params=2 * dense.params)  # what the dense KL run holds
    assert with_ref.table() in dense_out
