"""Benchmark (not a test): sampling with merged LoRA weights (merge once per rollout) vs unmerged `attach`.

    .venv/bin/python tests/lora/bench_lora_sampling.py [tiny small smollm2]

Prints, per model shape, the best of `REPS` rounds (interleaved) of: the jitted merge, a rollout of the merged
model, a rollout of the attached (unmerged) model, each after a warm-up call that compiles.
"""

import sys
import time

import jax
import numpy as np
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig, lora
from jaxrl.models.lora_forward import attach
from jaxrl.sampling import generate

REPS = 5
SHAPES = {
    "tiny": TransformerConfig.tiny(),  # D32 Y2 V64
    "small": TransformerConfig.tiny(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32,
                                    mlp_dim=768, vocab_size=2048),
    "smollm2": TransformerConfig.smollm2_135m(),  # its shape, random weights
}


def bench(cfg, prompts=8, samples=4, new_tokens=32, rank=16):
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    lcfg = lora.LoraConfig(rank=rank)
    ad = jax.tree.map(lambda x: x + 0.01, lora.init_adapters(params, lcfg, jax.random.key(0)))
    merge = jax.jit(lambda p, a: lora.merge(p, a, lcfg))
    rng = np.random.default_rng(0)
    batch = [list(rng.integers(3, cfg.vocab_size, 12)) for _ in range(prompts)]
    kw = dict(max_new_tokens=new_tokens, num_samples=samples, temperature=1.0, seed=0)

    def run_merge():
        return jax.block_until_ready(merge(params, ad))

    merged_model = Transformer.from_params(cfg, run_merge())
    attached = attach(model, ad, lcfg)
    fns = {"merge": run_merge,
           "rollout merged": lambda: jax.block_until_ready(generate(merged_model, batch, **kw).tokens),
           "rollout unmerged": lambda: jax.block_until_ready(generate(attached, batch, **kw).tokens)}
    best = {k: float("inf") for k in fns}
    for _ in range(REPS + 1):  # the first round compiles
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


if __name__ == "__main__":
    print(f"backend {jax.default_backend()}, devices {jax.device_count()}")
    for label in sys.argv[1:] or ["tiny", "small"]:
        best = bench(SHAPES[label])
        print(f"{label}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in best.items()))
