"""Decode benchmark: jaxrl `generate` vs transformers `generate` on the same weights, plus the roofline.

    .venv/bin/python benchmarks/sampling.py --model smollm2 --batch 16 --new-tokens 128 --scaling 64 128
    .venv/bin/python benchmarks/sampling.py --model qwen3-0.6b --batch 16 --new-tokens 64

Both sides decode greedily in float32 from the same left-padded prompts, with EOS disabled so every row
produces exactly `--new-tokens` tokens. Every quantity (both sides, the roofline chain, the read stream) is
timed once per round, round-robin, for `--repeats` rounds after a warm-up/compile run, and the best round of
each is reported: the VM's speed drifts within minutes, so only measurements taken side by side compare.
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

from jaxrl.runtime import host_memory  # noqa: E402

host_memory.configure_from_env()  # what the `jaxrl` CLI does before importing jax

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


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
        from jaxrl.io.gguf import ensure_smollm2_hf_dir

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


def hf_runner(model, prompts: list[list[int]], **generate_kwargs):
    """gen(n) -> [B, n] new tokens of transformers greedy `generate` on the left-padded prompts, on the
    model's device (`generate_kwargs`, e.g. `cache_implementation="static"`, go to `generate`)."""
    import torch

    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)

    def gen(n):
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0, **generate_kwargs)
        return out[:, width:].cpu().numpy()  # the copy to the host waits for the device

    gen(2)
    return gen


def jaxrl_runner(model, prompts: list[list[int]], new_tokens: int, per_layer: bool | None = None):
    """(gen(n) -> [B, n] new tokens of jaxrl greedy `generate`, compile seconds of the first call)."""
    from jaxrl import sampling

    def gen(n):
        out = sampling.generate(model, prompts, max_new_tokens=n, temperature=0.0, gen_buckets=(new_tokens,),
                                per_layer=per_layer)
        return np.asarray(jax.block_until_ready(out).tokens)

    return gen, _timed(lambda: gen(new_tokens))


def chain_runner(num_bytes: int, batch: int, width: int = 1024):
    """(run(), bytes): a jitted scan of [batch, width] @ [width, width] fp32 matmuls over `num_bytes` of
    weights (the roofline's bandwidth, at the decode batch's arithmetic intensity)."""
    n = max(1, num_bytes // (4 * width * width))
    w_NDD = jax.random.normal(jax.random.key(0), (n, width, width), jnp.float32) / np.sqrt(width)
    x_BD = jnp.ones((batch, width), jnp.float32)
    chain = jax.jit(lambda x_BD, w_NDD: jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x_BD, w_NDD)[0])
    run = lambda: jax.block_until_ready(chain(x_BD, w_NDD))  # noqa: E731
    run()
    return run, w_NDD.nbytes


def stream_runner(num_bytes: int):
    """(run(), bytes): a jitted `jnp.sum` over `num_bytes` of fp32, a pure read stream with no matmul (the
    memory-bandwidth ceiling; context for the matmul-chain roofline, which is what the fraction uses)."""
    x = jnp.ones((max(1, num_bytes // 4),), jnp.float32)
    total = jax.jit(jnp.sum)
    run = lambda: jax.block_until_ready(total(x))  # noqa: E731
    run()
    return run, x.nbytes


def decode_bytes(hf, batch: int, avg_context: float) -> tuple[int, int]:
    """(weight bytes read once per decode step, KV cache bytes of the average context) in fp32."""
    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())  # tied params are listed once
    c = hf.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4
    return weight_bytes, int(kv_per_token * batch * avg_context)


def load_both(name: str):
    """(torch model, jaxrl model) with identical fp32 weights; a random model goes through a saved HF dir."""
    from jaxrl.io.model_io import load_model

    hf, path = hf_model(name)
    if path is None:
        path = os.path.join(os.path.dirname(__file__), "..", ".cache", f"bench-{name}-random")
        if not os.path.isfile(os.path.join(path, "config.json")):
            hf.save_pretrained(path)
    model, _ = load_model(path)
    return hf, model


def _report(tag: str, batch: int, new_tokens: int, ttft: float, total: float) -> str:
    decode_s = max(total - ttft, 1e-9)
    return (f"{tag:8s} B={batch:4d} T={new_tokens:4d}  TTFT {ttft * 1e3:8.1f} ms  "
            f"total {total:7.2f} s  {batch * new_tokens / total:8.1f} tok/s  "
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
    ap.add_argument("--repeats", type=int, default=3, help="round-robin rounds")
    ap.add_argument("--also-scan", action="store_true",
                    help="also time jaxrl with per_layer=False (the layer scan in the decode loop)")
    args = ap.parse_args()

    import torch

    print(f"load average at start: {os.getloadavg()}")
    print(f"jax {jax.__version__} {jax.devices()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    hf, model = load_both(args.model)
    vocab, T = hf.config.vocab_size, args.new_tokens
    for i, batch in enumerate([args.batch, *args.scaling]):
        prompts = make_prompts(batch, vocab, *args.prompt_len)
        weight_b, kv_b = decode_bytes(hf, batch, np.mean([len(p) for p in prompts]) + T / 2)
        jax_gen, compile_s = jaxrl_runner(model, prompts, T)
        print(f"[{args.model}] jaxrl compile {compile_s:.1f} s", flush=True)
        chain, chain_bytes = chain_runner(weight_b + kv_b, batch)
        stream, stream_bytes = stream_runner(weight_b + kv_b)
        tokens: dict[str, np.ndarray] = {}
        runs = {"jaxrl_ttft": lambda: jax_gen(1), "jaxrl_total": lambda: tokens.update(jaxrl=jax_gen(T)),
                "chain": chain, "stream": stream}
        if args.also_scan:
            scan_gen, scan_compile_s = jaxrl_runner(model, prompts, T, per_layer=False)
            print(f"[{args.model}] jaxrl (scan) compile {scan_compile_s:.1f} s", flush=True)
            runs.update(scan_ttft=lambda: scan_gen(1), scan_total=lambda: tokens.update(scan=scan_gen(T)))
        if i == 0 or args.hf_scaling:
            hf_gen = hf_runner(hf, prompts)
            runs.update(hf_ttft=lambda: hf_gen(1), hf_total=lambda: tokens.update(hf=hf_gen(T)))
        # Round-robin: the VM's speed drifts within minutes, so every quantity is timed once per round and
        # the best round of each is kept; ratios then compare measurements taken side by side.
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.repeats):
            for name, fn in runs.items():
                best[name] = min(best[name], _timed(fn))
        step_s = (best["jaxrl_total"] - best["jaxrl_ttft"]) / (T - 1)
        roof_s = (weight_b + kv_b) / (chain_bytes / best["chain"])
        print(_report("jaxrl", batch, T, best["jaxrl_ttft"], best["jaxrl_total"]), flush=True)
        print(f"roofline: {weight_b / 1e6:.0f} MB weights + {kv_b / 1e6:.0f} MB KV at "
              f"{chain_bytes / best['chain'] / 1e9:.1f} GB/s (matmul chain, B={batch}) = "
              f"{roof_s * 1e3:.1f} ms/step; jaxrl achieves {roof_s / step_s:.0%}")
        if "scan" in tokens:
            scan_step_s = (best["scan_total"] - best["scan_ttft"]) / (T - 1)
            print(_report("scan", batch, T, best["scan_ttft"], best["scan_total"]))
            print(f"  per-layer decode vs layer scan: step {scan_step_s / step_s:.2f}x faster; roofline "
                  f"fraction with the scan {roof_s / scan_step_s:.0%}; tokens equal: "
                  f"{float(np.mean(tokens['scan'] == tokens['jaxrl'])):.1%}")
        stream_s = (weight_b + kv_b) / (stream_bytes / best["stream"])
        print(f"  (context: a plain read stream (jnp.sum) at {stream_bytes / best['stream'] / 1e9:.1f} GB/s "
              f"= {stream_s * 1e3:.1f} ms/step, {stream_s / step_s:.0%} of jaxrl's step)")
        if "hf" in tokens:
            print(_report("hf", batch, T, best["hf_ttft"], best["hf_total"]))
            match = float(np.mean(tokens["hf"] == tokens["jaxrl"]))
            print(f"jaxrl / transformers: {best['hf_total'] / best['jaxrl_total']:.2f}x tokens/s, "
                  f"TTFT {best['hf_ttft'] / best['jaxrl_ttft']:.2f}x; greedy tokens equal: {match:.1%}",
                  flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
