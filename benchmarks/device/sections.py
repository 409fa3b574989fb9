"""The accelerator suite's measurements: `sections.py SECTION[:SHAPE]... --mode gpu|dry --result-dir DIR`.

`suite.py` runs each section in its own child process on a GPU (so that a section's peak device memory is
its own, a hung section can be killed, and torch never shares the GPU with JAX's preallocated pool) and
combines the JSON files they write (`DIR/SECTION.SHAPE.json`); a failing section does not stop the next one.

Sections (SHAPE names a model shape where one applies):
* `device`: device-to-device copy bandwidth (bytes read + written), a read stream (`benchmarks/sampling.py`)
  and a bf16 matmul's FLOP/s: the ceilings measured in the same run as everything else.
* `decode_jaxrl` / `decode_hf`: greedy decode of B prompts for exactly T new tokens (no EOS) with
  `jaxrl.sampling.generate` / transformers `generate` (the runners of `benchmarks/sampling.py`), random bf16
  weights; `decode_hf_static` the same with transformers' static cache.
* `update`: jaxrl's GRPO update (`jaxrl.learner.train_step.train_step`, set up by `benchmarks/train_step.py`) in bf16
  compute over float32 master weights and AdamW moments, and its model FLOPs; `jaxrl.plan.memory` picks the
  gradient-accumulation micro-batch that fits.
* `train_cli`: `jaxrl plan` and then `jaxrl train` (2 steps) of `smollm2_grpo.yaml`, in this process.
Every JAX section reports its process's peak memory (`memory_stats()["peak_bytes_in_use"]`, or the host's
peak RSS where the backend keeps no memory statistics, as XLA:CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_CONFIG = HERE / "smollm2_grpo.yaml"
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one mode of the suite: `gpu` (the real measurement) or `dry` (tiny shapes on CPU)."""

    shapes: tuple[str, ...]  # model shapes of the decode and update sections
    decode_batch: int  # B prompts, one sample each
    new_tokens: int  # T, every row decodes exactly T tokens
    prompt_len: tuple[int, int]  # prompt lengths drawn from [lo, hi]
    jaxrl_rounds: int  # best of this many timed rounds (jaxrl decode)
    hf_rounds: int  # the same for transformers (slower per round)
    update_rows: int  # rows of one GRPO update (prompts x samples)
    update_prompt: int  # W: prompt width of a row
    update_completion: int  # T: completion width of a row
    update_steps: int  # timed updates after the compiling one (median reported)
    min_grad_accum: int  # smallest number of micro-batches (more when the plan says one does not fit)
    copy_bytes: int  # bytes of the bandwidth probes
    matmul_n: int  # n of the n x n x n bf16 matmul
    train_sets: tuple[str, ...]  # `--set` overrides of smollm2_grpo.yaml for `jaxrl plan` / `jaxrl train`


MODES = {
    "gpu": Settings(shapes=("qwen3_0_6b", "qwen3_1_7b"), decode_batch=64, new_tokens=512, prompt_len=(32, 64),
                    jaxrl_rounds=2, hf_rounds=1, update_rows=64, update_prompt=128, update_completion=512,
                    update_steps=3, min_grad_accum=1, copy_bytes=2 * GIB, matmul_n=8192, train_sets=()),
    # Same code at tiny sizes; two micro-batches so that the gradient-accumulation scan runs too. T = 32 and
    # the best of 3 keep the decode time well above the TTFT on a busy CPU (their difference is the rate).
    "dry": Settings(shapes=("qwen3_tiny",), decode_batch=4, new_tokens=32, prompt_len=(4, 8), jaxrl_rounds=3,
                    hf_rounds=1, update_rows=4, update_prompt=8, update_completion=8, update_steps=1,
                    min_grad_accum=2, copy_bytes=8 * 1024**2, matmul_n=256,
                    train_sets=("model.preset=tiny", "model.dtype=float32", "data.prompts_per_step=2",
                                "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.gen_buckets=[8]",
                                "rollout.prompt_buckets=[32]")),
}

# Dense bf16 tensor-core peak (FLOP/s) and HBM bandwidth (B/s) from NVIDIA's data sheets, by a substring of
# `device_kind`; the first match wins (so "H100 PCIe" before "H100"). H200 has H100 SXM's compute.
SPECS = (("H100 PCIe", 756e12, 2.0e12), ("H100 NVL", 835e12, 3.9e12), ("H100", 989.4e12, 3.35e12),
         ("H200", 989.4e12, 4.8e12))


def model_config(shape: str):
    """The `TransformerConfig` of a shape name: a preset of `jaxrl.io.build.PRESETS`, or `qwen3_tiny`."""
    from jaxrl.io.build import PRESETS

    if shape == "qwen3_tiny":  # Qwen3's architecture (qk-norm, tied embeddings) at test size
        return PRESETS["qwen3_0_6b"]().replace(vocab_size=2048, hidden_size=64, num_layers=2, num_heads=4,
                                               num_kv_heads=2, head_dim=16, mlp_dim=128, bos_token_id=1,
                                               eos_token_id=2, pad_token_id=0)
    return PRESETS[shape]()


def _bench(name: str):
    """`benchmarks/<name>.py` as a module (the folder is no package)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", HERE.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peak_memory() -> dict:
    """This process's peak device memory, or its peak host RSS where the backend keeps no statistics."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return dict(peak_bytes=int(stats["peak_bytes_in_use"]), peak_source="device memory_stats")
    return dict(peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, peak_source="host RSS")


def _best_seconds(fn, rounds: int) -> float:
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def device(s: Settings, shape: str | None) -> dict:
    import jax
    import jax.numpy as jnp

    dev = jax.devices()[0]
    x = jnp.ones((s.copy_bytes // 2,), jnp.bfloat16)
    copy = jax.jit(jnp.copy)  # a new buffer (the input is not donated): reads and writes every byte
    jax.block_until_ready(copy(x))
    copy_s = _best_seconds(lambda x=x: jax.block_until_ready(copy(x)), 5)
    del x
    read, read_bytes = _bench("sampling").stream_runner(s.copy_bytes)  # jnp.sum over fp32: reads only
    read_s = _best_seconds(read, 5)
    n, reps = s.matmul_n, 10
    a, b = (jax.random.normal(k, (n, n), jnp.bfloat16) for k in jax.random.split(jax.random.key(0)))
    mm = jax.jit(jnp.matmul)
    jax.block_until_ready(mm(a, b))
    mm_s = _best_seconds(lambda: jax.block_until_ready([mm(a, b) for _ in range(reps)]), 3) / reps
    spec = next(((f, bw) for key, f, bw in SPECS if key in dev.device_kind), (None, None))
    stats = dev.memory_stats() or {}
    return dict(platform=dev.platform, device_kind=dev.device_kind, jax_version=jax.__version__,
                copy_bytes=s.copy_bytes, copy_gb_s=2 * s.copy_bytes / copy_s / 1e9,
                read_gb_s=read_bytes / read_s / 1e9, matmul_n=n, matmul_tflops=2 * n**3 / mm_s / 1e12,
                spec_bf16_tflops=None if spec[0] is None else spec[0] / 1e12,
                spec_hbm_gb_s=None if spec[1] is None else spec[1] / 1e9,
                bytes_limit=stats.get("bytes_limit"))


def _decode_numbers(gen, s: Settings, rounds: int, *, ttft: bool = True) -> dict:
    """Total time of T new tokens and, with `ttft`, of one (prefill + first token) and the decode rates;
    best of `rounds` each."""
    t, total = s.new_tokens, math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        tokens = gen(t)
        total = min(total, time.perf_counter() - t0)
    if tokens.shape != (s.decode_batch, t):
        raise RuntimeError(f"expected {s.decode_batch} x {t} new tokens, got {tokens.shape}")
    out = dict(batch=s.decode_batch, new_tokens=t, total_s=total, tokens_per_s=s.decode_batch * t / total)
    if ttft:
        gen(1)  # warm-up: slicing one token off the outputs is a new (eager) shape
        first = _best_seconds(lambda: gen(1), rounds)
        step = (total - first) / (t - 1)
        out.update(ttft_s=first, step_s=step, decode_tokens_per_s=s.decode_batch / step)
    return out


def decode_jaxrl(s: Settings, shape: str) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from jaxrl.models import Transformer

    cfg = model_config(shape).replace(dtype="bfloat16", param_dtype="bfloat16")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    bench = _bench("sampling")
    prompts = bench.make_prompts(s.decode_batch, cfg.vocab_size, *s.prompt_len)
    gen, first_s = bench.jaxrl_runner(model, prompts, s.new_tokens)
    out = _decode_numbers(gen, s, s.jaxrl_rounds)
    # Bytes one decode step must read at least: every weight once (a tied embedding is one parameter) and the
    # KV cache of the average context (bf16 k and v of every layer).
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    context = float(np.mean([len(p) for p in prompts])) + s.new_tokens / 2
    kv_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * s.decode_batch * context
    return dict(out, shape=shape, first_call_s=first_s, weight_bytes=weight_bytes, kv_bytes=int(kv_bytes),
                **peak_memory())


def decode_hf(s: Settings, shape: str, static_cache: bool = False) -> dict:
    import torch
    import transformers

    from jaxrl.models.hf_io import config_to_hf

    on_gpu = torch.cuda.is_available()
    if not on_gpu:  # the dry run: one thread, as a shared CPU is oversubscribed (measured 25x slower with 2)
        torch.set_num_threads(1)
    hf_cfg = config_to_hf(model_config(shape))
    config = transformers.AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)
    torch.manual_seed(0)
    with torch.device("cuda" if on_gpu else "cpu"):  # random init directly on the device
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    bench = _bench("sampling")
    prompts = bench.make_prompts(s.decode_batch, config.vocab_size, *s.prompt_len)
    kwargs = dict(cache_implementation="static") if static_cache else {}
    t0 = time.perf_counter()
    gen = bench.hf_runner(model, prompts, **kwargs)  # includes a 2-token warm-up generation
    if static_cache:  # transformers compiles the forward for a static cache, per cache length
        gen(s.new_tokens)
    first_s = time.perf_counter() - t0
    out = _decode_numbers(gen, s, s.hf_rounds, ttft=not static_cache)
    peak = dict(peak_bytes=torch.cuda.max_memory_allocated(), peak_source="torch.cuda") if on_gpu else {}
    return dict(out, shape=shape, first_call_s=first_s, cache="static" if static_cache else "dynamic",
                torch_version=torch.__version__, transformers_version=transformers.__version__,
                weight_bytes=sum(p.numel() * p.element_size() for p in model.parameters()), **peak)


def model_flops(cfg, rows: int, prompt: int, completion: int) -> float:
    """Model FLOPs of one update (forward + backward = 3 x forward), PaLM's convention (arXiv:2204.02311 B):
    per token 2 x (block matmul parameters) + 4·Y·N·H·L for attention over the full row length L; the
    unembedding only at the T completion positions (2·D·V each), as jaxrl computes it. Padding counts."""
    d, n, k, h, f, y = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim,
                        cfg.num_layers)
    length = prompt + completion
    block_params = y * (d * (n + 2 * k) * h + n * h * d + 3 * d * f)
    unembed = rows * completion * 2 * d * cfg.vocab_size
    return 3.0 * (rows * length * (2 * block_params + 4 * y * n * h * length) + unembed)


def _grad_accum(cfg, s: Settings, limit: int | None, accelerator: str):
    """(micro-batches, `jaxrl.plan.memory.plan_memory` of one micro-batch): the fewest micro-batches, at least
    `s.min_grad_accum`, whose planned peak is at most half the device's memory limit (the plan leaves out
    XLA's temporaries, the accumulated gradients and the bf16 copy of the weights)."""
    from jaxrl.plan.memory import plan_memory
    from jaxrl.sharding import MeshConfig

    accum = s.min_grad_accum
    while True:
        micro = s.update_rows // accum
        plan = plan_memory(cfg, MeshConfig(data=1, fsdp=1, tensor=1), 1, batch=micro,
                           seq_len=s.update_prompt + s.update_completion, rollout_batch=micro, rollout_len=1,
                           accelerator=accelerator)
        if limit is None or plan.peak <= 0.5 * limit or micro == 1 or s.update_rows % (2 * accum):
            return accum, plan
        accum *= 2


def update(s: Settings, shape: str) -> dict:
    import jax
    from flax import nnx

    from jaxrl.models import Transformer
    from jaxrl.learner.train_step import LossSpec

    cfg = model_config(shape).replace(dtype="bfloat16", param_dtype="float32")
    dev = jax.devices()[0]
    accum, plan = _grad_accum(cfg, s, (dev.memory_stats() or {}).get("bytes_limit"), _plan_accelerator(dev))
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    params = params.to_pure_dict()
    bench = _bench("train_step")
    x = bench.make_inputs(s.update_rows, s.update_prompt, s.update_completion)
    step, state, batch = bench.jaxrl_update(graphdef, params, x, spec=LossSpec(grad_accum=accum))
    del params
    t0 = time.perf_counter()
    compiled = step.lower(state, batch, None).compile()
    compile_s = time.perf_counter() - t0
    state, metrics, first_s, times = bench.time_update(compiled, state, batch, None, s.update_steps)
    step_s = statistics.median(times)
    flops = model_flops(cfg, s.update_rows, s.update_prompt, s.update_completion)
    return dict(shape=shape, rows=s.update_rows, prompt=s.update_prompt, completion=s.update_completion,
                grad_accum=accum, compute_dtype=cfg.dtype, param_dtype=cfg.param_dtype, compile_s=compile_s,
                first_call_s=first_s, step_s=step_s, step_times_s=times, model_flops=flops,
                model_tflops=flops / step_s / 1e12,
                tokens_per_s=s.update_rows * (s.update_prompt + s.update_completion) / step_s,
                loss=float(metrics["loss"]), nonfinite=int(metrics["train/nonfinite"]),
                plan_peak_bytes=plan.peak, plan=_plan_parts(plan), **peak_memory())


def _plan_accelerator(dev) -> str:
    """The `jaxrl plan --accelerator` of this device (h100 for anything that is not an H200)."""
    return "h200" if "H200" in dev.device_kind else "h100"


def _plan_parts(plan) -> dict:
    return dict(params=plan.params, optimizer=plan.optimizer, gradients=plan.gradients,
                activations=plan.activations, kv_cache=plan.kv_cache, peak=plan.peak)


def train_cli(s: Settings, shape: str | None) -> dict:
    import jax

    from jaxrl import cli

    sets = [arg for kv in s.train_sets for arg in ("--set", kv)]
    printed = io.StringIO()
    try:  # a failing or changed `jaxrl plan` loses the memory comparison, not the training steps
        with contextlib.redirect_stdout(printed):
            cli.main(["plan", str(TRAIN_CONFIG), "--devices", "1", "--accelerator",
                      _plan_accelerator(jax.devices()[0]), *sets])
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        printed.write(f"jaxrl plan raised {type(e).__name__}: {e}")
    # The device table comes first, its row "peak   <GiB>"; the host table's peak row follows it.
    peak_rows = [line.split() for line in printed.getvalue().splitlines() if line.startswith("peak ")]
    plan_peak = int(float(peak_rows[0][1]) * GIB) if peak_rows else None
    with tempfile.TemporaryDirectory() as run_dir:
        t0 = time.perf_counter()
        rc = cli.main(["train", str(TRAIN_CONFIG), "--run-dir", run_dir, *sets])
        wall = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"jaxrl train exited with code {rc}")
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
        summary = Path(run_dir) / "run_summary.json"
        summary = json.loads(summary.read_text()) if summary.is_file() else {}
    kept = lambda k: k.startswith(_STEP_KEYS) or k in ("step", "loss", "reward/mean")  # noqa: E731
    steps = [{k: v for k, v in row.items() if kept(k)} for row in rows
             if any(k.startswith(("time/", "timing/")) for k in row)]
    if len(steps) != 2 or not all(math.isfinite(st.get("loss", math.nan)) for st in steps):
        raise RuntimeError(f"expected 2 steps with a finite loss in metrics.jsonl, got {steps}")
    return dict(config=TRAIN_CONFIG.name, overrides=list(s.train_sets), train_wall_s=wall, steps=steps,
                run_wall_s=summary.get("wall_s"), plan_peak_bytes=plan_peak,
                plan_table=printed.getvalue().strip(), **peak_memory())


# metrics.jsonl keys kept per step: the step's timings and throughputs (`time/*` in this tree, `timing/*_s`
# and `tokens_per_s` in earlier ones) and the bf16 sampler/trainer mismatch (`mismatch/*`).
_STEP_KEYS = ("time/", "timing/", "throughput/", "tokens_per_s", "mismatch/")


SECTIONS = {"device": device, "decode_jaxrl": decode_jaxrl, "decode_hf": decode_hf,
            "decode_hf_static": lambda s, shape: decode_hf(s, shape, static_cache=True),
            "update": update, "train_cli": train_cli}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tasks", nargs="+", metavar="SECTION[:SHAPE]", help=f"of {', '.join(SECTIONS)}")
    ap.add_argument("--mode", choices=sorted(MODES), default="gpu")
    ap.add_argument("--result-dir", required=True, help="each task writes TASK.json here when it ends")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    failed = 0
    for task in args.tasks:  # one failing task does not lose the others
        name, _, shape = task.partition(":")
        print(f"== section {task} ({args.mode})", flush=True)
        t0 = time.perf_counter()
        try:
            result = dict(status="ok", **SECTIONS[name](MODES[args.mode], shape or None))
        except Exception as e:  # noqa: BLE001 -- reported in the results, the next task still runs
            traceback.print_exc()
            result, failed = dict(status="error", error=f"{type(e).__name__}: {e}"[:2000]), failed + 1
        result["wall_s"] = time.perf_counter() - t0
        path = Path(args.result_dir) / f"{task.replace(':', '.')}.json"
        path.write_text(json.dumps(result, indent=1, default=float))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
