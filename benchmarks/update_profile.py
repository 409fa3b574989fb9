"""Where jaxrl's CPU update spends its time (issue 33 item 7): XLA's own per-op trace of the jitted train step,
by kind of op, and the fp32 GEMMs of its shapes against torch's.

    .venv/bin/python benchmarks/update_profile.py --prompt 64 --completion 128 [--batch 16] [--top 25]
    .venv/bin/python benchmarks/update_profile.py --gemm [--rows 3072]
    .venv/bin/python benchmarks/update_profile.py --model '{"hidden_size": 128, "mlp_dim": 384, "num_heads": 4,
        "num_kv_heads": 4}' --batch 32 --prompt 32 --completion 24    (a quickstart-sized step)

Profile: the update `benchmarks/train_step.py` times (tiny model, scanned layers, the trainer's CPU compiler
options, `xla_cpu_enable_xprof_traceme` on so that every thunk of the compiled program is a trace event), run
under `jax.profiler.trace`; the events are read back with jaxlib's `ProfileData` and summed per step: the
YNNPACK dot fusions (the model's matmuls), XLA's own `dot`s (the attention's batched products), copies and
transposes, broadcasts, and the remaining fused elementwise / reduce kernels. XLA:CPU runs independent thunks
side by side, so the sum of the events exceeds the step's wall time. `--gemm` times `a @ b` for the forward,
input-gradient and weight-gradient products of one layer (M = `--rows` tokens) in XLA (YNNPACK dot fusion,
as the trainer compiles) and in torch (oneDNN / MKL, 2 threads), each in its own process, best of 20.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import train_step  # noqa: E402  (benchmarks/train_step.py)

KINDS = (("ynn_fusion", "matmuls (YNNPACK dot fusions)"), ("dot", "XLA dots (attention's batched products)"),
         ("copy", "copies / transposes"), ("transpose", "copies / transposes"),
         ("wrapped_broadcast", "broadcasts (buffer initialisation)"))
HOST_EVENTS = ("ThunkExecutor", "$", "PjitFunction", "SlinkyThreadPool", "while", "end: ", "Common", "Allocate",
               "Handle", "Wait", "Threadpool", "PythonRef", "ParseArguments")


def kind(name: str) -> str:
    """The row of the breakdown an XLA:CPU thunk named `name` counts in."""
    return next((label for prefix, label in KINDS if name.startswith(prefix)), "other fused kernels")


def profile(args) -> dict:
    """Per-step milliseconds of every thunk of the jitted update, and the wall time per step."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    from flax import nnx
    from jax._src.lib import _profile_data

    from jaxrl.io import hf
    from jaxrl.models import Transformer, TransformerConfig

    with tempfile.TemporaryDirectory() as tmp:
        shape = dict(train_step.SHAPES[args.shape], **json.loads(args.model))
        shape["max_position_embeddings"] = max(shape["max_position_embeddings"], args.prompt + args.completion)
        hf.save_pretrained(Transformer(TransformerConfig(**shape), rngs=nnx.Rngs(0)), tmp)
        model = hf.from_pretrained(tmp)
    graphdef, params = nnx.split(model)
    x = train_step.make_inputs(args.batch, args.prompt, args.completion, group=args.group)
    step, state, batch = train_step.jaxrl_update(graphdef, params.to_pure_dict(), x, group=args.group,
                                                 extra_options={"xla_cpu_enable_xprof_traceme": True})
    for _ in range(2):  # compile, then one warm call
        state, m = step(state, batch, None)
        jax.block_until_ready(m["loss"])
    trace_dir = tempfile.mkdtemp()
    with jax.profiler.trace(trace_dir):
        start = time.perf_counter()
        for _ in range(args.steps):
            state, m = step(state, batch, None)
            jax.block_until_ready((state.params, m["loss"]))
        wall = (time.perf_counter() - start) / args.steps
    data = _profile_data.ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0])
    ms = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                if not event.name.startswith(HOST_EVENTS):
                    ms[event.name] += event.duration_ns / 1e6 / args.steps
    return dict(wall_ms=wall * 1e3, ops=dict(ms))


def gemm_side(side: str, rows: int, d: int, f: int, kv: int) -> dict[str, float]:
    """Best-of-20 seconds of `a @ b` at each (M, K, N) of one layer's forward and backward products."""
    import numpy as np

    forward = [(rows, d, d), (rows, d, kv), (rows, d, f), (rows, f, d)]
    shapes = [s for m, k, n in forward for s in ((m, k, n), (m, n, k), (k, m, n))]  # y = x W, dx, dW
    rng, out = np.random.default_rng(0), {}
    if side == "torch":
        import torch

        torch.set_num_threads(2)
        matmul = lambda a, b: a @ b  # noqa: E731
        arrays = lambda m, k, n: (torch.randn(m, k), torch.randn(k, n))  # noqa: E731
        ready = lambda y: y  # noqa: E731
    else:
        import jax
        import jax.numpy as jnp

        from jaxrl.learner.train_step import update_compiler_options

        matmul = jax.jit(lambda a, b: a @ b, compiler_options=update_compiler_options())
        arrays = lambda m, k, n: (jnp.asarray(rng.normal(size=(m, k)), jnp.float32),  # noqa: E731
                                  jnp.asarray(rng.normal(size=(k, n)), jnp.float32))
        ready = lambda y: y.block_until_ready()  # noqa: E731
    for m, k, n in shapes:
        a, b = arrays(m, k, n)
        for _ in range(3):
            ready(matmul(a, b))
        times = []
        for _ in range(20):
            start = time.perf_counter()
            ready(matmul(a, b))
            times.append(time.perf_counter() - start)
        out[f"{m}x{k}x{n}"] = min(times)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(train_step.SHAPES), default="tiny")
    ap.add_argument("--model", default="{}", help='JSON overrides of the profiled shape (not --gemm\'s), e.g. \'{"hidden_size": 128}\'')
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=20, help="print the slowest ops too")
    ap.add_argument("--gemm", action="store_true", help="the GEMM comparison instead of the profile")
    ap.add_argument("--rows", type=int, default=3072)
    ap.add_argument("--gemm-side", choices=("xla", "torch"), help=argparse.SUPPRESS)  # the child of --gemm
    args = ap.parse_args(argv)
    m = train_step.SHAPES[args.shape]
    dims = (args.rows, m["hidden_size"], m["mlp_dim"], m["num_kv_heads"] * m["head_dim"])
    if args.gemm_side:
        print(json.dumps(gemm_side(args.gemm_side, *dims)))
        return 0
    if args.gemm:
        runs = {}
        for side in ("torch", "xla", "torch", "xla"):  # alternating, each in a fresh process; best kept
            child = [sys.executable, __file__, "--gemm-side", side, "--rows", str(args.rows), "--shape", args.shape]
            got = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
            runs[side] = {k: min(v, runs.get(side, {}).get(k, v)) for k, v in got.items()}
        flops = {k: 2 * math.prod(map(int, k.split("x"))) for k in runs["torch"]}  # "MxKxN" keys
        print("| M x K x N | XLA GFLOP/s | torch GFLOP/s |\n|---|---|---|")
        for k in flops:
            print(f"| {k} | {flops[k] / runs['xla'][k] / 1e9:.0f} | {flops[k] / runs['torch'][k] / 1e9:.0f} |")
        total = {side: sum(flops.values()) / sum(t.values()) / 1e9 for side, t in runs.items()}
        print(f"| all (time-weighted) | {total['xla']:.0f} | {total['torch']:.0f} |")
        return 0
    report = profile(args)
    by_kind = collections.Counter()
    for name, ms in report["ops"].items():
        by_kind[kind(name)] += ms
    print(f"update {args.prompt} + {args.completion}, B = {args.batch}, G = {args.group}: "
          f"{report['wall_ms']:.0f} ms a step; thunk time {sum(by_kind.values()):.0f} ms (threads overlap)\n")
    print("| kind | ms a step | share of thunk time |\n|---|---|---|")
    for label, ms in by_kind.most_common():
        print(f"| {label} | {ms:.0f} | {ms / sum(by_kind.values()):.0%} |")
    print(f"\nslowest {args.top} thunks (ms a step): "
          + ", ".join(f"{n} {v:.1f}" for n, v in collections.Counter(report["ops"]).most_common(args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
