"""`model.attention`: cuDNN flash attention against jaxrl's blocked XLA core, on a GPU (issue 33 item 3).

    bash benchmarks/device/run.sh --attention [--out DIR]     on a lent GPU, wheels carried (about 3 minutes)
    python benchmarks/device/attention.py --cpu-dry-run       the same code at tiny shapes on CPU

Two parts, each case compiled once, then the median of `reps` timed calls:

* `core`: one attention call, forward + backward (`jax.value_and_grad` of a weighted sum), bf16 q/k/v with
  Qwen3-1.7B's heads (16 query heads over 8 kv heads, head dim 128), rows left-padded by 0-25 % and
  right-padded by 0-25 % of their width; self-attention (L = S) and shared-prompt completions (T queries after
  W prompt keys). Error: the largest |difference| at real queries from the blocked core in float32 on the same
  bf16 inputs, relative to that reference's largest |value|, for the output and dK.
* `model`: value and gradient of the mean log-prob of real completion tokens through a Qwen3-0.6B-shaped model
  (4 of its 28 layers, bf16 compute over float32 weights), `Transformer.forward` on [prompt | completion] rows
  and `Transformer.forward_groups` (the GRPO update's shared prompt), with `attention` "xla" and "cudnn".

For every case: milliseconds, the compiled program's temporary memory (`memory_analysis()`), and the
speed-up of cudnn over xla. Writes attention.json and attention.md to --out. With --cpu-dry-run "cudnn"
runs JAX's XLA reference of the same `jax.nn.dot_product_attention` call (tests/models/test_attention_fused.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

MIB = 1024**2
GPU = dict(core=[("self", 8, 0, 2048), ("shared", 16, 512, 1536), ("self", 2, 0, 8192)],
           model=(16, 256, 1536, 4), reps=5)
DRY = dict(core=[("self", 2, 0, 64), ("shared", 4, 16, 32)], model=(4, 8, 16, 2), reps=1)


def _timed(fn, args, reps):
    """(median ms over `reps` calls after a compiling one, temp MiB of the compiled program, its output)."""
    compiled = jax.jit(fn).lower(*args).compile()
    memory = compiled.memory_analysis()
    temp = getattr(memory, "temp_size_in_bytes", float("nan")) / MIB if memory is not None else float("nan")
    out = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times), temp, out


def _emit(row, out_dir):
    """Prints a finished case and appends it to attention.jsonl at once (a run cut short keeps it)."""
    print(json.dumps(row), flush=True)
    with open(Path(out_dir) / "attention.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _over(deadline):
    return time.monotonic() > deadline


def _masks(rng, rows, width):
    """[rows, width] bool: real tokens after a left pad and before a right pad of 0-25 % of the width each."""
    left = rng.integers(0, width // 4 + 1, rows)
    right = rng.integers(0, width // 4 + 1, rows)
    pos = np.arange(width)[None]
    return (pos >= left[:, None]) & (pos < width - right[:, None])


def core_cases(cases, reps, out_dir, deadline):
    from jaxrl.models.attention import KeyMask, attend

    rng = np.random.default_rng(0)
    kv, g, h = 8, 2, 128
    out = []
    for kind, b, w, t in cases:
        if _over(deadline):
            print(f"attention.py: out of time, skipping core {kind} B={b} W={w} L={t}", flush=True)
            continue
        s, length = w + t, t  # self-attention: w = 0
        q = jnp.asarray(rng.normal(size=(b, length, kv, g, h)), jnp.bfloat16)
        k, v = (jnp.asarray(rng.normal(size=(b, kv, s, h)), jnp.bfloat16) for _ in range(2))
        mask = _masks(rng, b, s) if kind == "self" else np.concatenate([_masks(rng, b, w) | (np.arange(w) >= w - 1),
                                                                        _masks(rng, b, t)], 1)
        mask_j = jnp.asarray(mask)
        real = mask[:, s - length:]
        weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * real[:, :, None, None, None]

        def loss(q, k, v, mask_BS, weights, kernel):  # inputs as arguments: XLA would fold constants
            o = attend(q, k, v, KeyMask(mask_BS, kernel=kernel), causal=True)
            return jnp.sum(weights * o.astype(jnp.float32)), o

        grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
        args = (q, k, v, mask_j, weights)
        ref = jax.jit(lambda q, k, v, *a: grad(q.astype(jnp.float32), k.astype(jnp.float32),
                                               v.astype(jnp.float32), *a, "xla"))(*args)
        row = dict(case=f"{kind} B={b} W={w} L={t}", tokens=int(mask.sum()))
        for kernel in ("xla", "cudnn"):
            try:
                ms, temp, ((_, o), (_, dk, _)) = _timed(lambda *a, kernel=kernel: grad(*a, kernel), args, reps)
                err_o = _rel_err(o, ref[0][1], real)
                err_dk = float(jnp.max(jnp.abs(dk.astype(jnp.float32) - ref[1][1])) / jnp.max(jnp.abs(ref[1][1])))
                row[kernel] = dict(ms=ms, temp_mib=temp, err_out=err_o, err_dk=err_dk)
            except Exception as e:  # noqa: BLE001 (a kernel that refuses a shape is a result)
                row[kernel] = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        out.append(row)
        _emit(row, out_dir)
    return out


def _rel_err(got, want, real_BL):
    diff = jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))
    sel = jnp.asarray(real_BL)[:, :, None, None, None]
    return float(jnp.max(jnp.where(sel, diff, 0)) / jnp.max(jnp.where(sel, jnp.abs(want), 0)))


def model_cases(sizes, reps, dry, out_dir, deadline):
    from flax import nnx

    from jaxrl.models import Transformer, TransformerConfig

    p_groups, w, t, layers = sizes
    group = 8 if not dry else 2
    base = (TransformerConfig.tiny(family="qwen3", qk_norm=True) if dry else TransformerConfig.qwen3_0_6b())
    base = base.replace(num_layers=layers, dtype="bfloat16", remat="dots")
    rng = np.random.default_rng(1)
    b = p_groups * group
    pmask = _masks(rng, p_groups, w) | (np.arange(w) >= w - 1)
    cmask = np.arange(t)[None] < rng.integers(t // 8, t + 1, b)[:, None]  # long-tailed-ish lengths
    prompt = jnp.asarray(np.where(pmask, rng.integers(3, base.vocab_size, (p_groups, w)), 0), jnp.int32)
    comp = jnp.asarray(np.where(cmask, rng.integers(3, base.vocab_size, (b, t)), 0), jnp.int32)
    pmask, cmask = jnp.asarray(pmask), jnp.asarray(cmask)
    params = nnx.state(Transformer(base, rngs=nnx.Rngs(0)), nnx.Param).to_pure_dict()

    def hidden(model, shared, prompt, pmask, comp, cmask):
        if shared:
            return model.forward_groups(prompt, pmask, comp, cmask)
        tokens = jnp.concatenate([jnp.repeat(prompt, group, 0), comp], 1)
        mask = jnp.concatenate([jnp.repeat(pmask, group, 0), cmask], 1)
        return model.forward(tokens, None, mask, return_hidden=True, return_logits=False).hidden[:, w - 1:w + t - 1]

    out = []
    for shared in (True, False):
        if _over(deadline):
            print(f"attention.py: out of time, skipping model shared={shared}", flush=True)
            continue
        row = dict(case=f"model {'shared prompt' if shared else 'unshared'} B={b} W={w} T={t} Y={layers}",
                   tokens=int(cmask.sum()))
        for kernel in ("xla", "cudnn"):
            cfg = base.replace(attention=kernel)

            def loss(p, prompt, pmask, comp, cmask, cfg=cfg, shared=shared):
                model = Transformer.from_params(cfg, p)
                logits = jnp.einsum("BTD,DV->BTV", hidden(model, shared, prompt, pmask, comp, cmask),
                                    model.unembedding(),
                                    preferred_element_type=jnp.float32)
                logp = jnp.take_along_axis(jax.nn.log_softmax(logits), comp[..., None], -1)[..., 0]
                return jnp.sum(jnp.where(cmask, logp, 0)) / jnp.sum(cmask)

            try:
                args = (params, prompt, pmask, comp, cmask)
                ms, temp, (value, _) = _timed(jax.value_and_grad(loss), args, reps)
                row[kernel] = dict(ms=ms, temp_mib=temp, loss=float(value))
            except Exception as e:  # noqa: BLE001
                row[kernel] = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        out.append(row)
        _emit(row, out_dir)
    return out


def markdown(rows, device):
    lines = [f"device: {device}", "",
             "| case | real tokens | xla ms | cudnn ms | cudnn speed-up | xla temp MiB | cudnn temp MiB | "
             "error xla / cudnn |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        x, c = r.get("xla", {}), r.get("cudnn", {})
        if "error" in x or "error" in c:
            lines.append(f"| {r['case']} | {r['tokens']} | {x.get('error', '')} | {c.get('error', '')} | | | | |")
            continue
        speed = x["ms"] / c["ms"]
        err = (f"out {x['err_out']:.1e} / {c['err_out']:.1e}, dK {x['err_dk']:.1e} / {c['err_dk']:.1e}"
               if "err_out" in x else f"loss {x['loss']:.6f} / {c['loss']:.6f}")
        lines.append(f"| {r['case']} | {r['tokens']} | {x['ms']:.2f} | {c['ms']:.2f} | {speed:.2f}x | "
                     f"{x['temp_mib']:.0f} | {c['temp_mib']:.0f} | {err} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/device/out"))
    parser.add_argument("--budget-s", type=float, default=200.0, help="no new case starts after this")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    Path(args.out).mkdir(parents=True, exist_ok=True)
    settings = DRY if args.cpu_dry_run else GPU
    if args.cpu_dry_run:
        from jaxrl.models import attention_fused

        attention_fused.IMPLEMENTATIONS["cudnn"] = "xla"
    elif jax.default_backend() != "gpu":
        sys.exit("attention.py: no GPU here (use --cpu-dry-run to check the code on CPU)")
    device = f"{jax.devices()[0].device_kind}, jax {jax.__version__}"
    print(device, flush=True)
    rows = []
    for part in (lambda: core_cases(settings["core"], settings["reps"], args.out, deadline),
                 lambda: model_cases(settings["model"], settings["reps"], args.cpu_dry_run, args.out, deadline)):
        try:
            rows += part()
        except Exception:  # noqa: BLE001 (keep what the other part measured)
            traceback.print_exc()
    out = Path(args.out)
    (out / "attention.json").write_text(json.dumps(dict(device=device, rows=rows), indent=1))
    (out / "attention.md").write_text(markdown(rows, device))
    print(markdown(rows, device))
    return 0 if rows and all("error" not in r.get(k, {}) for r in rows for k in ("xla", "cudnn")) else 1


if __name__ == "__main__":
    sys.exit(main())
