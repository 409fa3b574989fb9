"""The training forward's attention core on CPU: jaxrl's blocked XLA core vs torch's fused SDPA, forward and
forward + backward, causal, grouped-query heads (the update's attention; issue 33 item 7).

    .venv/bin/python benchmarks/attention_cpu.py                        # B x L = 16 x 1088, tiny model's heads
    .venv/bin/python benchmarks/attention_cpu.py --block-q 32,128 --rows 64 --length 272
    .venv/bin/python benchmarks/attention_cpu.py --heads 9 --kv-heads 3 --head-dim 64 --length 1280 --chunks 1,4

`--chunks`: also the core run over the batch in chunks of that many rows (`lax.map`, each chunk's blocks
sized for its rows: a smaller working set per loop; an experiment, not what the library runs).

jaxrl: `jaxrl.models.attention.attend` with a causal `KeyMask` (every key real), jitted with the update's
CPU compiler options (`jaxrl.learner.train_step.update_compiler_options`: YNNPACK's dot fusion), at each `--block-q`. torch:
`scaled_dot_product_attention(is_causal=True, enable_gqa=True)` (its CPU flash kernel), float32, the same
inputs. The backward is driven by a random cotangent (Σ w ∘ out), as in the update; a constant one (Σ out)
made XLA:CPU's YNNPACK dot fusion read uninitialised memory in this jax (garbage dV), which no update does.
Round-robin over --rounds, best round kept; seconds per call.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def _best(fn, rounds: int) -> float:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def _chunked(attend, q, k, v, rows: int):
    """`attend` (causal, every key real) over the batch in chunks of `rows` rows, one `lax.map` step each."""
    import jax
    import jax.numpy as jnp

    from jaxrl.models.attention import KeyMask

    n = q.shape[0] // rows
    split = lambda x: x.reshape((n, rows) + x.shape[1:])
    mask = KeyMask(jnp.ones((rows, q.shape[1]), bool))
    out = jax.lax.map(lambda qkv: attend(*qkv, mask, causal=True), (split(q), split(k), split(v)))
    return out.reshape(q.shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--length", type=int, default=1088)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--block-q", default="32,128", help="comma-separated query block sizes of jaxrl's core")
    ap.add_argument("--chunks", default="", help="comma-separated rows per batch chunk (lax.map over chunks)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import torch

    from jaxrl.learner.train_step import update_compiler_options
    from jaxrl.models.attention import KeyMask, attend

    b, l, n, kv, h = args.rows, args.length, args.heads, args.kv_heads, args.head_dim
    rng = np.random.default_rng(0)
    q_np = rng.standard_normal((b, l, kv, n // kv, h)).astype(np.float32)
    k_np, v_np = (rng.standard_normal((b, kv, l, h)).astype(np.float32) for _ in range(2))
    w_np = rng.standard_normal(q_np.shape).astype(np.float32)
    q, k, v, w = map(jnp.asarray, (q_np, k_np, v_np, w_np))
    mask = KeyMask(jnp.ones((b, l), bool))
    opts = update_compiler_options()

    def side(core):
        """(forward, forward + backward) calls of `core(q, k, v)`, compiled with the update's options."""
        fwd, grad = jax.jit(core), jax.jit(jax.grad(lambda q, k, v: jnp.sum(w * core(q, k, v)), argnums=(0, 1, 2)))
        fwd_c, grad_c = (f.lower(q, k, v).compile(opts) for f in (fwd, grad))
        jax.block_until_ready((fwd_c(q, k, v), grad_c(q, k, v)))
        return lambda: jax.block_until_ready(fwd_c(q, k, v)), lambda: jax.block_until_ready(grad_c(q, k, v))

    sides = {}
    for bq in (int(x) for x in args.block_q.split(",")):
        sides[f"jaxrl block_q={bq}"] = side(lambda q, k, v, bq=bq: attend(q, k, v, mask, causal=True, block_q=bq))
    for rows in (int(x) for x in args.chunks.split(",") if x):
        if b % rows:
            raise SystemExit(f"--chunks {rows} does not divide --rows {b}")
        sides[f"jaxrl {rows} rows/chunk"] = side(lambda q, k, v, rows=rows: _chunked(attend, q, k, v, rows))
    tq = torch.tensor(q_np.reshape(b, l, n, h).transpose(0, 2, 1, 3).copy(), requires_grad=True)
    tk, tv = (torch.tensor(x, requires_grad=True) for x in (k_np, v_np))
    tw = torch.tensor(w_np.reshape(b, l, n, h).transpose(0, 2, 1, 3).copy())
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)

    def torch_grad():
        tq.grad = tk.grad = tv.grad = None
        (sdpa() * tw).sum().backward()

    with torch.no_grad():
        sdpa()
    torch_grad()
    sides["torch sdpa"] = (lambda: torch.no_grad()(sdpa)(), torch_grad)
    best = {name: [float("inf"), float("inf")] for name in sides}
    for _ in range(args.rounds):
        for name, (f, g) in sides.items():
            best[name] = [min(best[name][0], _best(f, 1)), min(best[name][1], _best(g, 1))]
    ref = best["torch sdpa"]
    print(f"causal attention, B x L = {b} x {l}, {n} query heads over {kv} kv heads of {h}, float32, "
          f"torch threads {torch.get_num_threads()}, best of {args.rounds}:")
    for name, (f, g) in best.items():
        print(f"  {name:24s} forward {f:6.3f} s ({f / ref[0]:5.2f}x torch)   forward + backward {g:6.3f} s "
              f"({g / ref[1]:5.2f}x torch)")
    print(json.dumps({"shape": [b, l, n, kv, h], "seconds": best}))


if __name__ == "__main__":
    main()
