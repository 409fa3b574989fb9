"""Continuous batching vs the static batch vs transformers `generate` on a long-tailed workload (issue 33 item 6).

    .venv/bin/python benchmarks/continuous.py                        # long-tailed: 64 prompts x 8, 16..512
    .venv/bin/python benchmarks/continuous.py --equal 64 --no-hf     # every row 64 tokens

The workload: P prompts x G samples; each row's completion length is drawn once from a long-tailed law,
L = min(max, ⌊min / U⌋) with U ~ Uniform(0, 1] (P(L > x) = min / x: median 2·min, a few rows at max), and the
model is made to stop exactly there. jaxrl: a per-row length budget (`max_new_per_row`) with no EOS token;
transformers: a logits processor that forces EOS at the row's length (`min_new_tokens` is not per row). Both
sample (τ = 1) from the same fp32 weights (a random Qwen3 of `--hidden` x `--layers`, saved once under
.cache/ and loaded by jaxrl through `jaxrl.io.model_io`, the route of benchmarks/sampling.py). Useful tokens
= Σ L (the same for every engine); tokens/s = Σ L / wall time of the whole call.

Each engine is timed once per round, round-robin, for `--repeats` rounds after a compiling call; the best round
is kept. Also printed per jaxrl engine: decode steps, slot use (Σ L / (steps x rows decoded per step)),
the compiled program's memory (XLA's memory analysis: arguments + temporaries, of which the KV caches are
most), and a decode roofline: the bytes one decode step reads at least (weights once + the KV buffer the
attention reads: rows x capacity) at the memory bandwidth of a plain read stream (`jnp.sum`) in this run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from sampling import make_prompts, stream_runner  # noqa: E402  (benchmarks/sampling.py)


def long_tailed_lengths(rows: int, lo: int, hi: int, seed: int = 0) -> np.ndarray:
    """[rows] lengths L = min(hi, ⌊lo / U⌋), U ~ Uniform(0, 1]: P(L > x) = lo / x for lo <= x < hi."""
    u = 1.0 - np.random.default_rng(seed).random(rows)  # (0, 1]
    return np.minimum(hi, np.floor(lo / u)).astype(np.int32)


def random_qwen3(hidden: int, layers: int, vocab: int):
    """(torch model, jaxrl model) of one random fp32 Qwen3 (hidden / 64 heads of 64, half as many KV heads)."""
    import torch
    import transformers

    from jaxrl.io.model_io import load_model

    heads = max(1, hidden // 64)
    cfg = transformers.Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=heads,
                                   num_key_value_heads=max(1, heads // 2), head_dim=64, tie_word_embeddings=True,
                                   max_position_embeddings=2048, rope_theta=1e6, dtype="float32")
    path = os.path.join(os.path.dirname(__file__), "..", ".cache", f"bench-qwen3-{hidden}x{layers}-{vocab}")
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    if not os.path.isfile(os.path.join(path, "config.json")):
        hf.save_pretrained(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return hf, load_model(path)[0]


def hf_runner(hf, prompts, group: int, lengths: np.ndarray, eos: int):
    """run() -> [B] completion lengths of transformers sampling, each row forced to stop at lengths[row]."""
    import torch
    import transformers

    class ForceEos(transformers.LogitsProcessor):
        def __init__(self, width):
            self.width, self.stop = width, torch.as_tensor(lengths, dtype=torch.long)

        def __call__(self, input_ids, scores):
            at = (input_ids.shape[1] - self.width + 1) >= self.stop  # this token is the row's last
            forced = torch.full_like(scores, -float("inf"))
            forced[:, eos] = 0.0
            scores = torch.where(at[:, None], forced, scores)
            scores[~at, eos] = -float("inf")  # no earlier stop
            return scores

    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):], mask[b, width - len(p):] = torch.tensor(p), 1
    ids, mask = ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0)

    def run():
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=int(lengths.max()), do_sample=True,
                              top_k=0, temperature=1.0, pad_token_id=eos, eos_token_id=eos,
                              logits_processor=[ForceEos(width)])
        new = out[:, width:].numpy()
        return np.where((new == eos).any(1), (new == eos).argmax(1) + 1, new.shape[1])

    return run


def jaxrl_runner(model, prompts, group: int, lengths: np.ndarray, engine: str, slots: int | None):
    """(run() -> Generation, memory bytes of the compiled program) of `jaxrl.sampling.generate`."""
    from jaxrl import sampling

    spec = sampling.SamplingSpec(max_new_tokens=int(lengths.max()), num_samples=group, temperature=1.0,
                                 engine=engine, slots=slots)

    def run():
        return jax.block_until_ready(sampling.generate(model, prompts, spec, seed=0, max_new_per_row=lengths))

    run()
    return run, _program_bytes(model, prompts, spec, lengths)


def _program_bytes(model, prompts, spec, lengths) -> int:
    """Arguments + temporaries of the compiled decode program (XLA's memory analysis), lowered as `generate`
    calls it (per-layer CPU form)."""
    from flax import nnx

    from jaxrl.sampling import batching, continuous, engine

    graphdef, state = nnx.split(model)
    tokens, mask = batching.pad_prompts(prompts, spec.prompt_buckets, 0)
    program = (continuous.continuous_for if spec.engine == "continuous" else engine.rollout_for)(
        on_cpu=True, per_layer=True)
    extra = {"slots": spec.slots} if spec.engine == "continuous" else {}
    compiled = program.lower(
        graphdef, state, tokens, mask, jax.random.key(0), jnp.float32(1.0), jnp.float32(1.0),
        jnp.int32(spec.max_new_tokens), np.asarray([-1], np.int32), jnp.int32(0), lengths,
        num_samples=spec.num_samples, gen_width=batching.bucket(spec.max_new_tokens, spec.gen_buckets, "gen"),
        greedy=False, top_k=None, use_top_p=False, per_layer=True, **extra).compile()
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.temp_size_in_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--min", type=int, default=16)
    ap.add_argument("--max", type=int, default=512)
    ap.add_argument("--equal", type=int, default=0, help="every row this long instead (the equal-length case)")
    ap.add_argument("--slots", type=int, nargs="+", default=[64])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    args = ap.parse_args()

    import torch

    print(f"load average at start: {os.getloadavg()}; jax {jax.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)", flush=True)
    hf, model = random_qwen3(args.hidden, args.layers, args.vocab)
    rows = args.prompts * args.samples
    lengths = (np.full(rows, args.equal, np.int32) if args.equal
               else long_tailed_lengths(rows, args.min, args.max))
    prompts = make_prompts(args.prompts, args.vocab, 16, 32)
    useful = int(lengths.sum())
    print(f"{args.prompts} prompts x {args.samples} = {rows} rows; lengths: mean {lengths.mean():.1f}, median "
          f"{np.median(lengths):.0f}, max {lengths.max()}, at max {int((lengths == lengths.max()).sum())}; "
          f"useful tokens {useful}", flush=True)
    runs, memory = {}, {}
    t0 = time.perf_counter()
    runs["static"], memory["static"] = jaxrl_runner(model, prompts, args.samples, lengths, "static", None)
    for s in args.slots:
        runs[f"continuous S={s}"], memory[f"continuous S={s}"] = jaxrl_runner(
            model, prompts, args.samples, lengths, "continuous", s)
    print(f"compiled and warmed up in {time.perf_counter() - t0:.1f} s", flush=True)
    if not args.no_hf:
        runs["transformers"] = hf_runner(hf, prompts, args.samples, lengths, eos=1)
    weight_b = sum(p.numel() * p.element_size() for p in hf.parameters())
    kv_per_slot = 2 * args.layers * max(1, args.hidden // 128) * 64 * 4  # K and V, fp32, per cached token
    stream, stream_bytes = stream_runner(weight_b + 64 * (32 + int(lengths.max())) * kv_per_slot)
    runs["stream"] = stream
    best, outs = dict.fromkeys(runs, float("inf")), {}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t = time.perf_counter()
            outs[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t)
    bandwidth = stream_bytes / best.pop("stream")
    print(f"read-stream bandwidth {bandwidth / 1e9:.1f} GB/s (jnp.sum over {stream_bytes / 2 ** 20:.0f} MiB)")
    static_tps = useful / best["static"]
    for name, secs in best.items():
        line = f"{name:18s} {secs:7.2f} s  {useful / secs:9.1f} useful tok/s  {useful / secs / static_tps:5.2f}x static"
        if name in memory:
            gen = outs[name]
            steps = int(gen.decode_steps)
            decoded = rows if name == "static" else int(name.split("=")[1])
            capacity = 32 + int(lengths.max())
            step_bytes = weight_b + decoded * capacity * kv_per_slot
            line += (f"  steps {steps:4d}  slot use {useful / (steps * decoded):4.0%}  program "
                     f"{memory[name] / 2 ** 20:7.1f} MiB  step {secs / steps * 1e3:6.1f} ms vs roofline "
                     f"{step_bytes / bandwidth * 1e3:5.1f} ms")
            assert np.array_equal(np.asarray(gen.lengths), lengths), name
            if name != "static":
                same = np.array_equal(np.asarray(gen.tokens), np.asarray(outs["static"].tokens))
                line += f"  tokens == static: {same}"
        else:
            assert np.array_equal(outs[name], lengths), "transformers did not stop where the workload says"
        print(line, flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
