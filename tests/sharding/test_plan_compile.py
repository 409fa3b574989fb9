"""`jaxrl plan --compile` (`jaxrl.plan.compiled`): the run's train step, log-prob pass and sampler compiled from
abstract weights on the 8 fake CPU devices of tests/conftest.py, at a small model's shapes (issue 32 item 1).

Checked against what is known without XLA: the train step's per-device arguments are exactly the bytes of
the state's and the batch's shards (their shardings give them), the sampler's those of the weights and the
prompts, the donated state is aliased, an FSDP mesh all-gathers weights (in all three programs) where a
data-parallel one (fsdp = 1) all-gathers none, and both reduce gradients. A
program over the accelerator's HBM is one line and exit 2. (Measured on the way: with 2 rows a device and GRPO
groups of 4, the data-parallel step all-gathers 33 times, 1.7 MiB: a shared-prompt group split over devices
gathers its rows; with whole groups per device, as here, none.)
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from jaxrl.config import load_config
from jaxrl.errors import ConfigError

SMALL = ["model.overrides={hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, head_dim: 16, "
         "mlp_dim: 128}", "data.prompts_per_step=8", "rollout.group_size=4"]  # 4 rows (one group) a device


def _shard_bytes(tree) -> int:
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree))


_compiled: dict = {}


def _compile(mesh_sets):
    key = tuple(mesh_sets)
    if key not in _compiled:
        _compiled[key] = _compile_now(mesh_sets)
    return _compiled[key]


def _compile_now(mesh_sets):
    from jaxrl.plan import compiled as plan_compile
    from jaxrl.commands.plan import model_config
    from jaxrl.sharding import RULES, make_mesh

    cfg = load_config(None, SMALL + mesh_sets)
    mesh, rules = make_mesh(cfg.mesh), RULES[cfg.mesh.rules]
    _, state, _, _, _, frozen = plan_compile.abstract_inputs(cfg, model_config(cfg.model), mesh, rules)
    batch, _, _ = plan_compile.abstract_batch(cfg, mesh, rules, group=cfg.rollout.group_size)
    reports = plan_compile.compile_programs(cfg, model_config(cfg.model), mesh, rules)
    return (reports, state, batch) if frozen is None else (reports, state, batch, frozen)


@pytest.mark.parametrize("mesh_sets, gathers", [(["mesh.data=2", "mesh.fsdp=4"], True),
                                                (["mesh.data=8", "mesh.fsdp=1"], False)])
def test_programs_compile_with_the_sizes_their_shardings_give(mesh_sets, gathers):
    (step, logprobs, sampler), state, batch = _compile(mesh_sets)
    assert step.name == "train step (32 x 56 tokens, prompt shared by 4)" and logprobs.name == "log-prob pass"
    assert sampler.name == "sampler (8 x 4 rows, 32 + 24)"
    # the sampler reads the weights' shards, the prompts' shards and a few scalars (key, temperature, ...)
    prompts = 8 * 32 * 5 // 8  # int32 tokens + bool mask of 8 prompts, rows over all 8 devices (data x fsdp)
    assert 0 <= sampler.arguments - _shard_bytes(state.params) - prompts <= 64, sampler.arguments
    assert sampler.flops > 0 and (sampler.collectives["all-gather"]["count"] > 0) == gathers, sampler.collectives
    # jit drops arguments the program never reads: the reference log-probs, with no KL term
    unread = _shard_bytes(batch.ref_logp_BT)
    assert step.arguments == _shard_bytes(state) + _shard_bytes(batch) - unread
    assert step.aliased == _shard_bytes(state)  # the donated state is updated in place
    assert step.flops > logprobs.flops > 0 and step.temporaries > 0
    reduced = step.collectives["all-reduce"]["count"] + step.collectives["reduce-scatter"]["count"]
    assert reduced > 0  # gradients are reduced over the data (and fsdp) axes
    assert (step.collectives["all-gather"]["count"] > 0) == gathers, step.collectives
    assert (logprobs.collectives["all-gather"]["count"] > 0) == gathers, logprobs.collectives


LORA = ["mesh.data=2", "mesh.fsdp=4", "model.lora={rank: 4, alpha: 8}"]


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_a_lora_run_compiles_its_adapter_step_and_the_merge(quantize):
    """LoRA / QLoRA: the train step's state is the adapters and their moments (donated), the frozen base an
    argument beside them (int8 codes + scales under QLoRA); the merge writes the dense weights the log-prob pass
    and the sampler then read."""
    (step, merge, logprobs, sampler), state, batch, base = _compile(LORA + [f"model.quantize={quantize}"])
    dense = _compile(["mesh.data=2", "mesh.fsdp=4"])[1].params
    assert step.name == "train step (32 x 56 tokens, prompt shared by 4, LoRA r=4)" and merge.name == "LoRA merge"
    size = lambda tree: sum(math.prod(x.shape) for x in jax.tree.leaves(tree))  # noqa: E731
    assert set(state.params) == {"layers"} and size(state.params) < size(dense) / 4  # r = 4 adapters only
    unread = _shard_bytes(batch.ref_logp_BT)
    assert step.arguments == _shard_bytes(state) + _shard_bytes(base) + _shard_bytes(batch) - unread
    assert step.aliased == _shard_bytes(state)  # the adapters and moments in place; the base is not donated
    if quantize == "int8":  # one byte a kernel weight, a float scale a column
        assert _shard_bytes(base) < 0.5 * _shard_bytes(dense)
        assert any(np.dtype(x.dtype) == np.int8 for x in jax.tree.leaves(base))
    else:
        assert _shard_bytes(base) == _shard_bytes(dense)
    # base + s·A B: the dense weights, sharded as a dense run's (XLA adds the output tuple's 8-byte pointers)
    assert merge.outputs == _shard_bytes(dense) + 8 * len(jax.tree.leaves(dense))
    assert merge.arguments == _shard_bytes(base) + _shard_bytes(state.params)
    # the programs on the merged weights are the dense run's
    assert (logprobs.arguments, sampler.arguments) == tuple(
        r.arguments for r in _compile(["mesh.data=2", "mesh.fsdp=4"])[0][1:])


def test_a_bf16_samplers_f32_copy_of_its_kv_cache_is_named():
    """XLA:CPU widens a bf16 KV cache to float32 before its dots: the report names those bytes (the cache's
    f32 size, k and v, on each device) and leaves them out of what an accelerator holds; float32 has none."""
    from jaxrl.plan import compiled as plan_compile
    from jaxrl.commands.plan import model_config
    from jaxrl.sharding import RULES, make_mesh

    kv_f32 = 2 * 2 * (32 // 8) * (32 + 24) * 2 * 16 * 4  # k, v x layers x rows a device x S x kv heads x H x 4 B
    for dtype in ("bfloat16", "float32"):
        cfg = load_config(None, SMALL + ["mesh.data=2", "mesh.fsdp=4", f"model.dtype={dtype}"])
        # XLA's default fusion emitters (the suite turns them off, tests/_xla.py; without them XLA:CPU carries
        # the bf16 cache as f32 through the decode loop instead of copying it, which the report does not name)
        compiled = plan_compile._lower_sampler(cfg, model_config(cfg.model), make_mesh(cfg.mesh),
                                               RULES[cfg.mesh.rules]).compile(
            compiler_options={"xla_cpu_use_fusion_emitters": True})
        r = plan_compile.report("sampler", compiled, 0.0)
        if dtype == "float32":
            assert r.upcasts == 0 and r.accelerator_total == r.total
        else:
            assert kv_f32 <= r.upcasts <= kv_f32 + 1024, (r.upcasts, kv_f32)  # + a few small rows
            assert r.accelerator_total == r.total - r.upcasts


def test_the_step_shares_prompts_only_where_the_trainer_does():
    """`jaxrl plan --compile` compiles the shared-prompt step only when the trainer would run it: a step's
    rows in whole groups per data shard x mini-batch x micro-batch (`jaxrl.rl.batch.prompt_groups`)."""
    from jaxrl.plan.compiled import shared_group
    from jaxrl.rl.batch import shares_whole_groups
    from jaxrl.sharding import RULES, make_mesh

    assert shares_whole_groups(32, 4, 8) and not shares_whole_groups(16, 4, 8)
    assert not shares_whole_groups(512, 8, 32 * 4) and not shares_whole_groups(32, 1, 8)
    for sets, group in ((SMALL, 4), (SMALL + ["data.prompts_per_step=4"], 1),
                        (SMALL + ["algorithm.mini_batches=2"], 1), (SMALL + ["train.share_prompts=never"], 1),
                        (SMALL + ["data.prompts_per_step=16", "algorithm.mini_batches=2"], 4)):
        cfg = load_config(None, sets + ["mesh.data=2", "mesh.fsdp=4"])
        assert shared_group(cfg, make_mesh(cfg.mesh), RULES[cfg.mesh.rules], 1) == group, sets


def test_a_program_over_the_hbm_is_one_line(capsys, monkeypatch):
    from jaxrl.plan import compiled as plan_compile
    from jaxrl.commands import plan as plan_cmd
    from jaxrl.commands.plan import model_config
    from jaxrl.plan.memory import plan_memory

    cfg = load_config(None, SMALL + ["mesh.data=2", "mesh.fsdp=4"])
    model_cfg = model_config(cfg.model)
    plan = plan_memory(model_cfg, cfg.mesh, 8, batch=32, seq_len=56, rollout_batch=32, rollout_len=56,
                       accelerator="v5e")
    reports = _compile(["mesh.data=2", "mesh.fsdp=4"])[0]  # compiled once for the module
    monkeypatch.setattr(plan_compile, "compile_programs", lambda *a: reports)
    with pytest.raises(ConfigError, match=r"^--compile: train step \(32 x 56 tokens, prompt shared by 4\) needs "
                                          r"0\.\d\d GiB per device, over the 0 GiB of HBM of v5e$"):
        plan_cmd._compile(cfg, model_cfg, dataclasses.replace(plan, hbm=1024), 8)
    assert "compiled peak" in capsys.readouterr().out  # the table is printed before the verdict
    with pytest.raises(ConfigError, match=r"this process already runs JAX on 8 devices"):
        plan_cmd._compile(cfg, model_cfg, plan, 32)
