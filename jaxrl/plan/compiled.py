"""`jaxrl plan --compile`: the run's real jitted programs lowered and compiled at the config's real shapes.

From abstract parameters (`Transformer.abstract`: shapes, dtypes and shardings, no weight read or allocated)
on the config's mesh over N devices, the same functions the trainer jits (`jaxrl.learner.train_step.jitted_train_step`,
`jitted_logprob_pass`) are lowered and compiled by XLA, and for each program this reports

    per-device memory   XLA's `memory_analysis()`: arguments, outputs, temporaries, aliased (donated) bytes;
                        total = arguments + outputs + temporaries - aliased
    FLOPs               XLA's `cost_analysis()["flops"]` of the per-device program
    collectives         `jaxrl.plan.collectives` of the compiled module: count and result bytes per kind,
                        each collective op counted once: one inside the sampler's decode loop runs once per
                        generated token (an FSDP sampler all-gathers the weights at every step)
    bf16->f32           the temporaries that are XLA:CPU's float32 copies of bfloat16 arrays (it has no bf16
                        dot: `collectives.upcast_bytes`); "accel" = total less them, what an accelerator with
                        bf16 dots holds, and what is checked against its HBM. Qwen3-1.7B's bf16 sampler on
                        v6e-8: 16.3 GiB of temporaries = the 5.25 GiB bf16 KV cache + its 10.5 GiB f32 copy
                        + 0.6 (in float32: 11.1 = the 10.5 GiB cache + 0.6).

On fake CPU devices (`--xla_force_host_platform_device_count`) the program is XLA:CPU's: the SPMD
partitioning, hence the collectives and the sharded argument/output sizes, are the ones a TPU or GPU compile
of the same mesh gets; temporaries, fusion and layouts are the CPU compiler's (a TPU fuses more and pads to
its tiles), so the temporaries are an indication, not a measurement. Programs covered: the train step (mini-
batch, remat, sharding, shared-prompt groups as the run uses them), the log-prob pass, and the sampler (one
program: the prefill of a step's prompts and the decode loop with its KV cache, `jaxrl.sampling.engine`). A
LoRA / QLoRA run compiles its own train step (the adapters and their moments as the state, the frozen base,
int8 / nf4 under QLoRA, as an argument: `jaxrl.rl.policy.LoRA`) and the merge W + s·A B that gives the sampler
and the log-prob pass their dense weights once per step; those two run the dense programs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.plan.collectives import KINDS, collectives, upcast_bytes

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class ProgramReport:
    """One compiled program, per device."""

    name: str
    arguments: int
    outputs: int
    temporaries: int
    aliased: int
    flops: float
    collectives: dict[str, dict[str, int]]
    compile_s: float
    upcasts: int = 0  # temporaries that are XLA:CPU's f32 copies of bf16 arrays

    @property
    def total(self) -> int:
        return self.arguments + self.outputs + self.temporaries - self.aliased

    @property
    def accelerator_total(self) -> int:
        """`total` without XLA:CPU's f32 copies of bf16 arrays (an accelerator with bf16 dots makes none)."""
        return self.total - self.upcasts


def report(name: str, compiled, compile_s: float) -> ProgramReport:
    """The `ProgramReport` of a `jax.stages.Compiled`."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # one dict per device program in older jax
    text = compiled.as_text()
    return ProgramReport(name, int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                         int(mem.temp_size_in_bytes), int(mem.alias_size_in_bytes),
                         float((cost or {}).get("flops", float("nan"))), collectives(text), compile_s,
                         min(upcast_bytes(text), int(mem.temp_size_in_bytes)))


@contextlib.contextmanager
def captured_stderr():
    """Captures this process's file descriptor 2 (where XLA's C++ logging writes) for the block, then writes
    it back to stderr unchanged; yields a function returning the captured lines."""
    sys.stderr.flush()
    saved, tmp = os.dup(2), tempfile.TemporaryFile(mode="w+b")
    lines: list[str] = []
    os.dup2(tmp.fileno(), 2)
    try:
        yield lambda: lines
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
        tmp.close()
        sys.stderr.write(text)
        lines.extend(text.splitlines())


def _abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _propagated(fn, *args):
    """`fn(*args)` as abstract arrays with the shardings XLA gives its outputs (compiled from abstract `args`:
    how the trainer's placed arrays come out of the same computation)."""
    compiled = jax.jit(fn).lower(*args).compile()
    return _abstract(jax.eval_shape(fn, *args), compiled.output_shardings)


def abstract_inputs(cfg, model_cfg, mesh, rules):
    """(graphdef, abstract TrainState with shardings, state shardings, LossSpec, optimizer, frozen) of `cfg`;
    `frozen`: the abstract base a LoRA train step takes next to its adapters (None for a dense run)."""
    from jaxrl.rl import setup as rl_setup
    from jaxrl.rl.run import placed_shardings
    from jaxrl.algorithms import ALGORITHMS
    from jaxrl.models import Transformer
    from jaxrl.learner.optim import build_optimizer
    from jaxrl.sharding import make_constrain, state_shardings
    from jaxrl.learner.train_step import TrainState

    model = Transformer.abstract(model_cfg, constrain=make_constrain(mesh, rules))
    graphdef, params_state = nnx.split(model)
    param_sharding = state_shardings(params_state, mesh, rules).to_pure_dict()
    params = _abstract(params_state.to_pure_dict(), param_sharding)
    tx = build_optimizer(cfg.optimizer, cfg.train.steps)
    spec = rl_setup.loss_spec(cfg, ALGORITHMS[cfg.algorithm.name], rl_setup.algo_settings(cfg))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    frozen = None
    if cfg.model.lora is None:
        opt_state = jax.eval_shape(tx.init, params)
        opt_sharding = state_shardings(opt_state, mesh, rules, params=params_state)
        opt_state = _abstract(opt_state, opt_sharding)
    else:  # as `jaxrl.rl.setup._lora_setup`: adapters trained, the (maybe quantised) base frozen
        params, param_sharding, frozen = lora_inputs(cfg, params, mesh, rules)
        spec = dataclasses.replace(spec, lora=cfg.model.lora)
        opt_state = _propagated(tx.init, params)  # the moments take their adapter's sharding
        opt_sharding = placed_shardings(opt_state, mesh)  # and the counts replicated, as the trainer places them
        opt_state = _abstract(opt_state, opt_sharding)
    state_sharding = TrainState(params=param_sharding, opt_state=opt_sharding, step=rep)
    state = TrainState(params=params, opt_state=opt_state, step=jax.ShapeDtypeStruct((), jnp.int32, sharding=rep))
    return graphdef, state, state_sharding, spec, tx, frozen


def lora_inputs(cfg, params, mesh, rules):
    """(abstract adapters, their shardings, abstract frozen base) of a LoRA run from the abstract dense params."""
    from jaxrl.models import lora, quant
    from jaxrl.sharding.lora import adapter_shardings

    lora_cfg = cfg.model.lora
    adapters = jax.eval_shape(lambda p: lora.init_adapters(p, lora_cfg, jax.random.key(0)), params)
    shardings = adapter_shardings(adapters, mesh, rules)
    base = params
    if cfg.model.quantize != "none":
        base = _propagated(lambda p: quant.quantize_params(p, cfg.model.quantize), params)
    return _abstract(adapters, shardings), shardings, base


def abstract_batch(cfg, mesh, rules, *, group: int):
    """A mini-batch of the run's shape as ShapeDtypeStructs sharded like the trainer's batches: rows =
    prompts_per_step · group_size / mini_batches, width = the longest prompt bucket + the generation width."""
    from jaxrl.sharding import batch_shardings
    from jaxrl.learner.train_step import TrainBatch

    r, a = cfg.rollout, cfg.algorithm
    rows = cfg.data.prompts_per_step * r.group_size // a.mini_batches
    w, t = max(r.prompt_buckets), max(r.gen_buckets) if r.gen_buckets else r.max_new_tokens
    s = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    f32, bt, b = jnp.float32, (rows, t), (rows,)
    batch = TrainBatch(s((rows, w + t), jnp.int32), s((rows, w + t), jnp.bool_), s(bt, jnp.bool_), s(bt, f32),
                       s(bt, f32), s(bt, f32), s(b, f32), s(b, f32), s(b, f32), group=group)
    return _abstract(batch, batch_shardings(batch, mesh, rules)), w, t


def shared_group(cfg, mesh, rules, grad_accum: int) -> int:
    """The group whose rows the train step runs with one shared prompt (1: unshared), as the trainer decides
    (`jaxrl.rl.batch.prompt_groups`): only when a step's rows split into whole groups per data shard x
    mini-batch x micro-batch. (Compiling the shared program regardless, as this command first did, put
    Qwen3-8B's step on 32 devices, 16 groups a mini-batch, at 98 GiB a device with all-to-alls: groups
    straddling devices; the trainer runs it unshared, at 24 GiB.)"""
    from jaxrl.rl.batch import rows_multiple_of, shares_whole_groups

    g, rows = cfg.rollout.group_size, cfg.data.prompts_per_step * cfg.rollout.group_size
    multiple = rows_multiple_of(mesh, rules, cfg.algorithm.mini_batches, grad_accum)
    return g if cfg.train.share_prompts != "never" and shares_whole_groups(rows, g, multiple) else 1


def compile_programs(cfg, model_cfg, mesh, rules) -> list[ProgramReport]:
    """Lowers and compiles the train step and the log-prob pass of `cfg` on `mesh` (abstract inputs)."""
    import time

    from jaxrl.learner.train_step import jitted_logprob_pass, jitted_train_step

    graphdef, state, state_sharding, spec, tx, frozen = abstract_inputs(cfg, model_cfg, mesh, rules)
    group = shared_group(cfg, mesh, rules, spec.grad_accum)
    batch, w, t = abstract_batch(cfg, mesh, rules, group=group)
    out = []
    t0 = time.perf_counter()
    step = jitted_train_step(graphdef, spec, tx, state_sharding)
    compiled = step.lower(state, batch, frozen).compile()
    shared = f", prompt shared by {group}" if group > 1 else ""
    lora_note = f", LoRA r={cfg.model.lora.rank}" if frozen is not None else ""
    out.append(report(f"train step ({batch.tokens_BL.shape[0]} x {w + t} tokens{shared}{lora_note})", compiled,
                      time.perf_counter() - t0))
    dense = state.params
    if frozen is not None:  # the sampling weights: base + adapters merged once per step (`policy.LoRA`)
        from jaxrl.models import lora

        t0 = time.perf_counter()
        merge = lambda b, a: lora.merge(b, a, cfg.model.lora)  # noqa: E731
        compiled = jax.jit(merge).lower(frozen, state.params).compile()
        out.append(report("LoRA merge", compiled, time.perf_counter() - t0))
        dense = _abstract(jax.eval_shape(merge, frozen, state.params), compiled.output_shardings)
    t0 = time.perf_counter()
    logprobs = jitted_logprob_pass(graphdef, spec)
    compiled = logprobs.lower(dense, batch.tokens_BL, batch.mask_BL, t, group).compile()
    out.append(report("log-prob pass", compiled, time.perf_counter() - t0))
    t0 = time.perf_counter()
    compiled, prompts = _lower_sampler(cfg, model_cfg, mesh, rules).compile(), cfg.data.prompts_per_step
    engine = cfg.rollout.engine
    slots = f", {engine.slots or prompts * cfg.rollout.group_size} slots" if engine.kind == "continuous" else ""
    out.append(report(f"sampler ({prompts} x {cfg.rollout.group_size} rows{slots}, {w} + {t})", compiled,
                      time.perf_counter() - t0))
    return out


def _lower_sampler(cfg, model_cfg, mesh, rules):
    """The sampler's program (`jaxrl.sampling.engine.rollout`: the prefill of a step's prompts, once per group,
    and the whole decode loop with its KV cache) lowered at the run's shapes: prompts_per_step prompts of the
    longest prompt bucket, rows sharded like the trainer's, the accelerator form (the layer scan; the CPU's
    per-layer decode is a CPU-only choice)."""
    from jaxrl.models import Transformer
    from jaxrl.sampling import continuous, engine
    from jaxrl.sharding import batch_shardings, make_constrain, state_shardings

    r = cfg.rollout
    graphdef, params_state = nnx.split(Transformer.abstract(model_cfg, constrain=make_constrain(mesh, rules)))
    shardings = state_shardings(params_state, mesh, rules)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params_state, shardings)
    prompts = (cfg.data.prompts_per_step, max(r.prompt_buckets))
    tokens = jax.ShapeDtypeStruct(prompts, jnp.int32)
    tokens = _abstract(tokens, batch_shardings(tokens, mesh, rules))
    mask = _abstract(jax.ShapeDtypeStruct(prompts, jnp.bool_), tokens.sharding)
    scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)  # noqa: E731
    key = jax.eval_shape(lambda: jax.random.key(0))
    gen_width = max(r.gen_buckets) if r.gen_buckets else r.max_new_tokens
    # the engine the run samples with: `rollout.engine` (the continuous one decodes `slots` rows a step)
    program, extra = engine.rollout, {}
    if r.engine.kind == "continuous":
        program, extra = continuous.continuous, {"slots": r.engine.slots or prompts[0] * r.group_size}
    return program.lower(
        graphdef, state, tokens, mask, key, scalar(jnp.float32), scalar(jnp.float32), scalar(jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32), scalar(jnp.int32),
        jax.ShapeDtypeStruct((prompts[0] * r.group_size,), jnp.int32), num_samples=r.group_size,
        gen_width=gen_width, greedy=r.temperature == 0.0, top_k=r.top_k, use_top_p=r.top_p is not None,
        per_layer=False, **extra)


def table(reports: list[ProgramReport], analytic_peak: int) -> str:
    """The per-program table (GiB per device, GFLOP, collective MiB) and the analytic plan's peak beside."""
    width = max(34, *(len(r.name) + 2 for r in reports))
    head = (f"{'program':<{width}}" + "".join(f"{c:>8}" for c in ("args", "out", "temp", "alias", "total"))
            + f"{'bf16>f32':>9}{'accel':>8}{'GFLOP':>10}  collectives")
    lines = ["compiled programs, per device (GiB; collectives: count x MiB of results)", head]
    for r in reports:
        coll = ", ".join(f"{k} {r.collectives[k]['count']} x {r.collectives[k]['bytes'] / 2 ** 20:.1f}"
                         for k in KINDS if r.collectives[k]["count"])
        lines.append(f"{r.name:<{width}}" + "".join(f"{v / GIB:>8.3f}" for v in (
            r.arguments, r.outputs, r.temporaries, r.aliased, r.total)) + f"{r.upcasts / GIB:>9.3f}"
            + f"{r.accelerator_total / GIB:>8.3f}{r.flops / 1e9:>10.1f}  "
            + (coll or "none") + f"  [compiled in {r.compile_s:.1f} s]")
    peak, accel = max(r.total for r in reports), max(r.accelerator_total for r in reports)
    lines.append(f"compiled peak {peak / GIB:.3f} GiB ({accel / GIB:.3f} without XLA:CPU's f32 copies of bf16 "
                 f"arrays) vs analytic plan {analytic_peak / GIB:.3f} GiB (ratio {peak / max(analytic_peak, 1):.2f}, "
                 f"{accel / max(analytic_peak, 1):.2f})")
    return "\n".join(lines)
