"""jaxrl plan: per-device numbers for the tiny model against a hand calculation, and the CLI."""

import pytest

from jaxrl import cli
from jaxrl.errors import ConfigError
from jaxrl.models import TransformerConfig
from jaxrl.plan.memory import GIB, plan_memory
from jaxrl.sharding import MeshConfig

# Tiny: V=64, D=32, Y=2, N=4, K=2, H=8, F=64, untied head, pre-norm, no qk-norm, no bias.
# embed 64*32 = 2048; per layer q 32*4*8 = 1024, k 512, v 512, o 1024, gate/up/down 3*2048 = 6144,
# 2 norms 64 -> 9280; x2 layers = 18560; final norm 32; lm_head 2048.  Total 22688.
TINY_PARAMS = 2048 + 2 * (1024 + 512 + 512 + 1024 + 3 * 2048 + 2 * 32) + 32 + 2048


def _tiny_plan(remat="none", mesh=MeshConfig(fsdp=4), devices=4, **kw):
    return plan_memory(TransformerConfig.tiny(), mesh, devices, batch=8, seq_len=16, rollout_batch=16,
                       rollout_len=24, remat=remat, **kw)


def test_tiny_fsdp4_by_hand():
    p = _tiny_plan()
    assert TINY_PARAMS == 22688 and p.num_params == TINY_PARAMS
    # every tiny parameter has an `embed` dimension, split 4 ways; float32
    assert p.params == TINY_PARAMS // 4 * 4 == 22688
    assert p.optimizer == 2 * 4 * TINY_PARAMS // 4
    assert p.gradients == p.params
    # b = 8/4 = 2 rows x 16 = 32 tokens; per token and layer: 4D + 2NH + 2KH + 3F + 2NL
    per_token = 4 * 32 + (2 * 4 * 8 + 2 * 2 * 8) + 3 * 64 + 2 * 4 * 16
    assert per_token == 544
    logits = 2 * 4 * 32 * 64
    assert p.activations == 32 * 4 * 2 * per_token + logits == 155648
    # rollout rows 16/4 = 4, S = 24: k and v of 2 layers x 2 kv heads x 8, float32; plus the bool mask
    assert p.kv_cache == 2 * 2 * 4 * 24 * 2 * 8 * 4 + 4 * 24 == 24672
    assert p.peak == p.params + p.optimizer + p.gradients + p.activations
    assert p.fits


def test_tiny_remat_and_tensor_parallel_by_hand():
    full = _tiny_plan("full")
    none_set = 544
    assert full.activations == 32 * 4 * (2 * 32 + none_set) + 2 * 4 * 32 * 64
    dots = _tiny_plan("dots")
    assert dots.activations == 32 * 4 * (2 * (2 * 32 + 96 + 2 * 64 + 4 * 16) + none_set) + 2 * 4 * 32 * 64
    mlp = _tiny_plan("mlp")  # the MLP's 3F recomputed one layer at a time
    assert mlp.activations == 32 * 4 * (2 * (none_set - 3 * 64) + 3 * 64) + 2 * 4 * 32 * 64
    attention = _tiny_plan("attention")  # input D, core output N·H, max and normaliser per query head
    assert attention.activations == 32 * 4 * (2 * (32 + 4 * 8 + 2 * 4) + none_set) + 2 * 4 * 32 * 64
    # fsdp=2, tensor=2: b = 4 rows -> 64 tokens; heads, mlp and vocab halve; embedding (vocab, embed) / 4
    tp = _tiny_plan(mesh=MeshConfig(fsdp=2, tensor=2, rules="fsdp_tp"))
    # the 5 RMSNorm weights (embed only: 2 layers x 2 + final = 160 elements) split 2 ways, the rest 4 ways
    norms = 2 * 2 * 32 + 32
    assert tp.params == ((TINY_PARAMS - norms) // 4 + norms // 2) * 4 == 22848
    per_token = 4 * 32 + 96 // 2 + 3 * 64 // 2 + 2 * 4 * 16 // 2
    assert tp.activations == 64 * 4 * 2 * per_token + 2 * 4 * 64 * 32
    assert tp.kv_cache == 2 * 2 * 8 * 24 * 1 * 8 * 4 + 8 * 24


def test_logits_chunk_bounds_the_logits_term():
    unchunked = _tiny_plan(logits_chunk=None)
    assert unchunked.activations == _tiny_plan().activations  # V = 64 < the default chunk of 8192
    assert _tiny_plan(logits_chunk=16).activations == unchunked.activations - 2 * 4 * 32 * (64 - 16)


def test_reference_model_doubles_params_and_bf16_halves():
    assert _tiny_plan(reference_model=True).params == 2 * _tiny_plan().params
    tiny16 = TransformerConfig.tiny(dtype="bfloat16", param_dtype="bfloat16")
    bf16 = plan_memory(tiny16, MeshConfig(fsdp=4), 4, batch=8, seq_len=16, rollout_batch=16, rollout_len=24,
                       remat="none")
    assert bf16.params == _tiny_plan().params // 2 and bf16.optimizer == _tiny_plan().optimizer
    assert bf16.kv_cache == 2 * 2 * 4 * 24 * 2 * 8 * 2 + 4 * 24


def test_plan_errors():
    with pytest.raises(ConfigError, match=r"batch 8 is not divisible by data x fsdp = 1 x 3 = 3"):
        _tiny_plan(mesh=MeshConfig(fsdp=3), devices=3)
    msg = r"layers.self_attn.k_proj.kernel: dimension 2 of shape \(2, 32, 2, 8\) has size 2, .* tensor=4"
    with pytest.raises(ConfigError, match=msg):
        _tiny_plan(mesh=MeshConfig(fsdp=1, tensor=4, rules="fsdp_tp"), devices=4)
    with pytest.raises(ConfigError, match=r"accelerator='tpu': allowed values are v4, v5e, v5p"):
        _tiny_plan(accelerator="tpu")


def test_qwen3_8b_plan_from_abstract_shapes():
    p = plan_memory(TransformerConfig.qwen3_8b(), MeshConfig(fsdp=-1), 32, batch=64, seq_len=1024,
                    rollout_batch=256, rollout_len=1024, remat="full", accelerator="v5p")
    assert 8.18e9 < p.num_params < 8.20e9  # Qwen3-8B: 8.19 B with an untied head
    qk_norms = 36 * 2 * 128  # q_norm/k_norm weights have only `head_dim`: replicated
    assert p.params == ((p.num_params - qk_norms) // 32 + qk_norms) * 4
    assert p.fits and p.hbm == 95 * GIB


def test_cli_prints_table_and_exit_code(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model: {preset: tiny, dtype: float32, remat: none}\n"
        "data: {prompts_per_step: 2}\n"
        "rollout: {group_size: 4, max_new_tokens: 8, prompt_buckets: [8, 16]}\n"
        "mesh: {data: 1, fsdp: -1, tensor: 1}\n"
    )
    assert cli.main(["plan", str(cfg), "--devices", "4", "--accelerator", "v5e"]) == 0
    out = capsys.readouterr().out
    assert "batch 8 x 24 tokens, rollout 8 x 24, remat none" in out
    assert "mesh data=1 fsdp=4 tensor=1; 0.000 B parameters" in out and "fits: peak is" in out
    assert cli.main(["plan", str(cfg), "--devices", "3"]) == 2
    assert "batch 8 is not divisible by data x fsdp = 1 x 3 = 3" in capsys.readouterr().err


def test_cli_prints_the_per_host_ram_of_the_run(tmp_path, capsys):
    """Issue 13 item 5: next to the per-chip table, what one host's RAM holds: 4 chips' shards of the fp32
    parameters and both AdamW moments staged for a checkpoint, the whole model read at start, the rollout
    arrays (8 rows: 5 bytes per position of 24 + 21 per completion position of 8 per row)."""
    from jaxrl.commands.plan import model_config
    from jaxrl.config import load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model: {preset: tiny, dtype: float32, remat: none, overrides: {hidden_size: 512, num_layers: 8,"
        " mlp_dim: 1536, num_heads: 8, num_kv_heads: 8, head_dim: 64, vocab_size: 32000}}\n"
        "data: {prompts_per_step: 2}\n"
        "rollout: {group_size: 4, max_new_tokens: 8, prompt_buckets: [8, 16]}\n"
        "mesh: {data: 1, fsdp: -1, tensor: 1}\n"
    )
    assert cli.main(["plan", str(cfg), "--devices", "8", "--chips-per-host", "4"]) == 0
    out = capsys.readouterr().out
    run_cfg = load_config(str(cfg), [])
    dev = plan_memory(model_config(run_cfg.model), run_cfg.mesh, 8, batch=8, seq_len=24, rollout_batch=8,
                      rollout_len=24)
    assert dev.num_params > 40_000_000  # large enough for the table's 3 decimals of GiB to be checked
    rows = dict(line.rsplit(None, 1) for line in out.splitlines()[-5:])
    assert "per host (4 chips)" in out
    gib = lambda key: float(rows[key]) * GIB  # noqa: E731
    assert gib("checkpoint staging") == pytest.approx(4 * (dev.params + dev.optimizer), rel=5e-3)
    assert gib("initial weight load") == pytest.approx(dev.num_params * 4, rel=5e-3)
    staged = max(4 * (dev.params + dev.optimizer), dev.num_params * 4)  # staging or load, never both at once
    assert gib("peak") == pytest.approx(2 * GIB + 8 * (5 * 24 + 21 * 8) + staged, rel=5e-3)
