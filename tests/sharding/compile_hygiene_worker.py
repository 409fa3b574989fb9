"""Compiles the train step and log-prob pass (unshared and shared-prompt) and the rollout of one reduced
shipped config on fake CPU devices.

Run by test_compile_hygiene.py as a subprocess (the compiler writes its warnings to the process's stderr);
not collected by pytest. argv: CONFIG_PATH DATA FSDP TENSOR. Prints "compiled <what>" lines on stdout.
`probe()` compiles a program known to need an involuntary full rematerialization (the test's positive control).
"""

import os
import sys
from pathlib import Path

from tests._xla import xla_flags

_DEVICES = int(sys.argv[2]) * int(sys.argv[3]) * int(sys.argv[4])  # 8, or 1 for a one-device config
# tests/_xla.py's COMPILE_ONLY: -O0 and XLA:CPU's MLIR fusion emitters off, this process is all compiling (run
# from the repository root). The emitters generate each fusion's kernel after every HLO pass (the SPMD
# partitioner, which writes the warnings, runs first) and took half of this process's CPU time: evpv_tiny's
# three programs on 8 devices 27.0 -> 14.1 s CPU (2026-11-29); the positive control (`probe`) still warns.
os.environ["XLA_FLAGS"] = xla_flags(_DEVICES, compile_only=True)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl.rl import batch as rl_batch, setup as rl_setup  # noqa: E402
from jaxrl.config import load_config  # noqa: E402
from jaxrl.sampling import generate_from_state  # noqa: E402
from jaxrl.learner.train_step import TrainBatch  # noqa: E402

# Reduced models keep the family's layout flags (tied head, qkv bias, q/k norm) and shrink every size.
SMALL = "{hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, head_dim: 16, mlp_dim: 128}"
PRESET_OF = {"qwen2.5": "qwen2_5_1_5b", "qwen3-0.6b": "qwen3_0_6b", "qwen3-1.7b": "qwen3_1_7b",
             "qwen3-8b": "qwen3_8b", "smollm2": "smollm2_135m"}


def reduced(path: str, data: int, fsdp: int, tensor: int):
    raw = load_config(path, [])
    sets = [f"mesh.data={data}", f"mesh.fsdp={fsdp}", f"mesh.tensor={tensor}", "sft_warmup.steps=0",
            "rollout.max_new_tokens=8", "rollout.gen_buckets=[8]", "rollout.prompt_buckets=[16]",
            "rollout.group_size=2", "model.lora=null"]
    if raw.model.hf_path:
        name = Path(raw.model.hf_path).name.lower()
        preset = next(p for key, p in PRESET_OF.items() if key in name)
        sets += ["model.hf_path=null", f"model.preset={preset}", "tokenizer.kind=builtin"]
    sets.append(f"model.overrides={SMALL[:-1]}, vocab_size: 128, max_position_embeddings: 64}}")
    return load_config(path, sets)


def main() -> None:
    path, data, fsdp, tensor = sys.argv[1], *map(int, sys.argv[2:5])
    cfg = reduced(path, data, fsdp, tensor)
    run, state, _ = rl_setup.setup(cfg, Path("/nonexistent-run-dir"))
    n, w, t = 16, 16, 8
    rng = np.random.default_rng(0)
    zeros, ones = np.zeros((n, t), np.float32), np.ones((n,), np.float32)
    g = cfg.rollout.group_size  # 2: 8 groups, one per batch shard of the 8-device meshes
    tokens = rng.integers(3, 100, (n, w + t)).astype(np.int32)
    tokens[:, :w] = np.repeat(tokens[::g, :w], g, axis=0)  # GRPO rows: one prompt per group
    # both forwards: unshared (group 1) and shared-prompt (`TrainBatch.group`, the trainer's default)
    batches = [rl_batch.shard_batch(run, TrainBatch(tokens, np.ones((n, w + t), bool), np.ones((n, t), bool),
                                                   zeros, zeros, zeros, ones * 0.2, ones * 0.2, ones * 0,
                                                   group=group)) for group in (1, g)]
    for batch in batches:
        jax.block_until_ready(run.logprob_fn(state.params, batch.tokens_BL, batch.mask_BL, t, batch.group))
    print("compiled log-prob pass", flush=True)
    for batch in batches:
        state, metrics = run.step_fn(state, batch)
        jax.block_until_ready(metrics)
    print("compiled train step", flush=True)
    prompts = [list(rng.integers(3, 100, 5 + i % 7)) for i in range(8)]
    gen = generate_from_state(run.graphdef, state.params, prompts, run.sampling, eos_ids=(2,), seed=0,
                              pad_id=0)
    jax.block_until_ready(gen.tokens)
    print("compiled rollout", flush=True)


def probe() -> None:
    """Compiles, on the 8 devices, a sum whose operands' shardings GSPMD cannot convert without replicating
    (openxla/xla#15207): the compiler must warn "Involuntary full rematerialization" on stderr."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("x", "y"))
    rows, cols = NamedSharding(mesh, P("y", None, "x")), NamedSharding(mesh, P(None, ("x", "y"), None))
    fn = jax.jit(lambda a, b: b + jax.lax.with_sharding_constraint(a * 2, cols), in_shardings=(rows, cols),
                 out_shardings=cols)
    x = jax.ShapeDtypeStruct((16, 16, 16), np.float32)
    fn.lower(x, x).compile()
    print("compiled probe", flush=True)


if __name__ == "__main__":
    main()
