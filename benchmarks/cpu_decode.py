"""CPU decode: the rollout with YNNPACK fusions off (jaxrl's `engine.CPU_DECODE_OPTIONS`) vs on (XLA's default).

    .venv/bin/python benchmarks/cpu_decode.py                      # the 4-layer test model, 8 prompts x G samples
    .venv/bin/python benchmarks/cpu_decode.py --model smollm2-shape --samples 2 --new-tokens 32

Both programs are the same `jaxrl.sampling.engine._rollout` (per-layer decode, as on CPU by default, both with
region-based copy insertion), compiled once each, then timed round-robin for `--repeats` rounds on the same
prompts and seed; the best round of each is reported, with their ratio. Random-init weights: decode cost does
not depend on the values (the tokens may).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from flax import nnx

from jaxrl.io import build
from jaxrl.config import ModelConfig
from jaxrl.models import Transformer
from jaxrl.sampling import engine, generate

SHAPES = {
    "tiny": (dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=4, head_dim=32, mlp_dim=384,
                  max_position_embeddings=384), 128),
    "smollm2-shape": (dict(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, mlp_dim=1536,
                           max_position_embeddings=512), 49152),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--samples", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--new-tokens", type=int, default=56)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    overrides, vocab = SHAPES[args.model]
    cfg = build.preset_config(ModelConfig(preset="tiny_siamese", norm="siamese", overrides=overrides), vocab)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    prompts = [list(np.random.default_rng(p).integers(3, vocab - 1, size=args.prompt_len))
               for p in range(args.prompts)]
    programs = {
        "jaxrl CPU options": engine.rollout_for.cpu_per_layer,
        "YNNPACK fusions on": jax.jit(engine._rollout, static_argnames=engine._STATIC, compiler_options={
            k: v for k, v in engine.CPU_PER_LAYER_OPTIONS.items() if k not in engine.CPU_DECODE_OPTIONS}),
    }
    print(f"{args.model}, {args.prompts} prompts of {args.prompt_len} tokens, {args.new_tokens} new tokens, "
          f"best of {args.repeats} rounds (seconds per rollout)")
    for samples in args.samples:
        best = {name: float("inf") for name in programs}
        for rnd in range(args.repeats + 1):  # round 0 compiles
            for name, program in programs.items():
                engine.rollout_for.cpu_per_layer = program  # what `rollout_for(on_cpu=True, per_layer=True)` returns
                start = time.perf_counter()
                out = generate(model, prompts, num_samples=samples, max_new_tokens=args.new_tokens,
                               temperature=1.0, seed=0, per_layer=True)
                jax.block_until_ready(jax.tree.leaves(out))
                if rnd:
                    best[name] = min(best[name], time.perf_counter() - start)
        engine.rollout_for.cpu_per_layer = programs["jaxrl CPU options"]
        ours, default = best["jaxrl CPU options"], best["YNNPACK fusions on"]
        print(f"rows {args.prompts * samples:4d}: jaxrl {ours:.3f}  YNNPACK on {default:.3f}  "
              f"speed-up {default / ours:.2f}x")


if __name__ == "__main__":
    main()
