"""jaxrl.plan.host: per-host RAM, hand-computed, and consistent with jaxrl.plan.memory's per-chip numbers."""

import pytest

from jaxrl.models import TransformerConfig
from jaxrl.plan.memory import GIB, plan_memory
from jaxrl.plan.host import plan_host
from jaxrl.sharding import MeshConfig


def test_hand_computed_components():
    p = plan_host(params_per_chip=1000, optimizer_per_chip=8000, chips_per_host=4, num_params=3000,
                  param_bytes=2, rollout_rows=16, prompt_len=10, completion_len=6, resample_rounds=1,
                  runtime_gib=0.5)
    assert p.staging == 4 * 9000
    assert p.load == 6000
    assert p.rollout == 32 * (5 * 16 + 21 * 6)  # 2 rounds of 16 rows
    assert p.runtime == GIB // 2
    assert p.peak == GIB // 2 + 32 * 206 + 36000
    assert "checkpoint staging" in p.table() and "per host (4 chips)" in p.table()


def test_qwen3_8b_on_v5p_64_from_the_device_plan():
    cfg = TransformerConfig.qwen3_8b()
    dev = plan_memory(cfg, MeshConfig(data=1, fsdp=32), 32, batch=64, seq_len=1024, rollout_batch=512,
                      rollout_len=1024, remat="full")
    host = plan_host(params_per_chip=dev.params, optimizer_per_chip=dev.optimizer, chips_per_host=4,
                     num_params=dev.num_params, param_bytes=2, rollout_rows=512, prompt_len=256,
                     completion_len=768)
    # 4 of 32 chips: an eighth of the fp32 params (4 bytes/param) and fp32 moments (8 bytes/param)
    assert cfg.param_dtype == "float32"
    assert host.staging == pytest.approx(dev.num_params * 12 / 8, rel=0.01)
    assert host.load == dev.num_params * 2
    assert 15 * GIB < host.peak < 25 * GIB  # ~16 GiB model load + 2 GiB runtime + ~40 MB rollout arrays
