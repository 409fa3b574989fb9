"""Decode benchmark: jaxrl `generate` vs transformers `generate` on the same weights, plus the roofline.

    .venv/bin/python benchmarks/sampling.py --model smollm2 --batch 16 --new-tokens 128 --scaling 64 128
    .venv/bin/python benchmarks/sampling.py --model qwen3-0.6b --batch 16 --new-tokens 64

Both sides decode greedily in float32 from the same left-padded prompts, with EOS disabled so every row
produces exactly `--new-tokens` tokens. Reported per side (best of `--repeats` timed runs after one
warm-up/compile run):
* TTFT: time of a 1-token generation (prefill + first token). jaxrl reuses the full-length program (the decode
  loop stops after one step), so the timing has no compile and the same cache capacity.
* tokens/s: B·T / total time, and decode tokens/s: B·(T-1) / (total - TTFT).
Roofline: bytes one decode step must read at least = all weights once (a tied embedding counted once) + the
KV cache of the average context, divided by the bandwidth achieved in this run by a jitted scan of
[B, D] @ [D, D] matmuls over the same number of bytes (same batch, so also the same arithmetic intensity).
The fraction is roofline step time / measured decode step time.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def make_prompts(batch: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    """Random token prompts of lengths in [lo, hi] (ids from [100, vocab) to avoid special tokens)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(batch)]


def hf_model(name: str):
    """(torch model, a Hugging Face dir it can be loaded from or None) for a benchmark model name."""
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "smollm2":
        from jaxrl.gguf import ensure_smollm2_hf_dir

        path = ensure_smollm2_hf_dir("float32")
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), path
    if name == "qwen3-0.6b":
        cfg = transformers.Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
            max_position_embeddings=4096, rope_theta=1e6, dtype="float32",
        )
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval(), None
    raise SystemExit(f"unknown --model {name!r}; allowed: smollm2, qwen3-0.6b")


def bench_hf(model, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """transformers greedy generate with left padding; returns timings and the generated tokens."""
    import torch

    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1

    def gen(n):
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=0)

    gen(2)
    ttft = _best(lambda: gen(1), repeats)
    out = []
    total = _best(lambda: out.append(gen(new_tokens)), repeats)
    return dict(ttft=ttft, total=total, tokens=out[-1][:, width:].numpy())


def bench_jaxrl(model, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """jaxrl greedy generate; the first call compiles and is timed separately."""
    from jaxrl import sampling

    gen_buckets = (new_tokens,)

    def gen(n):
        out = sampling.generate(model, prompts, max_new_tokens=n, temperature=0.0, gen_buckets=gen_buckets)
        return jax.block_until_ready(out)

    t0 = time.perf_counter()
    gen(new_tokens)
    compile_s = time.perf_counter() - t0
    ttft = _best(lambda: gen(1), repeats)
    out = []
    total = _best(lambda: out.append(gen(new_tokens)), repeats)
    return dict(ttft=ttft, total=total, tokens=np.asarray(out[-1].tokens), compile=compile_s)


def measured_bandwidth(num_bytes: int, batch: int, width: int = 1024, repeats: int = 5) -> float:
    """Bytes/s of a jitted scan of [batch, width] @ [width, width] fp32 matmuls over `num_bytes` of weights.
    """
    n = max(1, num_bytes // (4 * width * width))
    w_NDD = jax.random.normal(jax.random.key(0), (n, width, width), jnp.float32) / np.sqrt(width)
    x_BD = jnp.ones((batch, width), jnp.float32)

    @jax.jit
    def chain(x_BD, w_NDD):
        return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x_BD, w_NDD)[0]

    jax.block_until_ready(chain(x_BD, w_NDD))
    t = _best(lambda: jax.block_until_ready(chain(x_BD, w_NDD)), repeats)
    return w_NDD.nbytes / t


def decode_bytes(hf, batch: int, avg_context: float) -> tuple[int, int]:
    """(weight bytes read once per decode step, KV cache bytes of the average context) in fp32."""
    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())  # tied params are listed once
    c = hf.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4
    return weight_bytes, int(kv_per_token * batch * avg_context)


def load_both(name: str):
    """(torch model, jaxrl model) with identical fp32 weights; a random model goes through a saved HF dir."""
    from jaxrl.model_io import load_model

    hf, path = hf_model(name)
    if path is None:
        path = os.path.join(os.path.dirname(__file__), "..", ".cache", f"bench-{name}-random")
        if not os.path.isfile(os.path.join(path, "config.json")):
            hf.save_pretrained(path)
    model, _ = load_model(path)
    return hf, model


def _report(tag: str, batch: int, new_tokens: int, r: dict) -> str:
    decode_s = max(r["total"] - r["ttft"], 1e-9)
    return (f"{tag:8s} B={batch:4d} T={new_tokens:4d}  TTFT {r['ttft'] * 1e3:8.1f} ms  "
            f"total {r['total']:7.2f} s  {batch * new_tokens / r['total']:8.1f} tok/s  "
            f"decode {batch * (new_tokens - 1) / decode_s:8.1f} tok/s  "
            f"step {decode_s / (new_tokens - 1) * 1e3:7.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | qwen3-0.6b")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 32), metavar=("MIN", "MAX"))
    ap.add_argument("--scaling", type=int, nargs="*", default=(), help="extra batch sizes (jaxrl only)")
    ap.add_argument("--hf-scaling", action="store_true", help="run transformers at --scaling batches too")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import torch

    print(f"load average at start: {os.getloadavg()}")
    print(f"jax {jax.__version__} {jax.devices()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    hf, model = load_both(args.model)
    vocab, T = hf.config.vocab_size, args.new_tokens
    for i, batch in enumerate([args.batch, *args.scaling]):
        prompts = make_prompts(batch, vocab, *args.prompt_len)
        j = bench_jaxrl(model, prompts, T, args.repeats)
        print(f"[{args.model}] jaxrl compile {j['compile']:.1f} s")
        print(_report("jaxrl", batch, T, j), flush=True)
        weight_b, kv_b = decode_bytes(hf, batch, np.mean([len(p) for p in prompts]) + T / 2)
        bw = measured_bandwidth(weight_b + kv_b, batch)
        roof_s = (weight_b + kv_b) / bw
        step_s = (j["total"] - j["ttft"]) / (T - 1)
        print(f"roofline: {weight_b / 1e6:.0f} MB weights + {kv_b / 1e6:.0f} MB KV at {bw / 1e9:.1f} GB/s "
              f"(matmul chain, B={batch}) = {roof_s * 1e3:.1f} ms/step; jaxrl achieves {roof_s / step_s:.0%}")
        if i == 0 or args.hf_scaling:
            h = bench_hf(hf, prompts, T, args.repeats)
            print(_report("hf", batch, T, h))
            match = float(np.mean(h["tokens"] == j["tokens"]))
            print(f"jaxrl / transformers: {h['total'] / j['total']:.2f}x tokens/s, "
                  f"TTFT {h['ttft'] / j['ttft']:.2f}x; greedy tokens equal: {match:.1%}", flush=True)


    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
