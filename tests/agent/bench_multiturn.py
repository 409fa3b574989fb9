"""Re-prefill vs KV-cache continuation for multi-turn decoding (not a test; run by hand, ~1-3 min on CPU).

    .venv/bin/python tests/agent/bench_multiturn.py [--episodes 16] [--turns 4] [--obs 150] [--new 32]

A quickstart-sized model (4 layers, D=128, random weights) and `TurnDecoder` alone: every episode samples
exactly `--new` tokens per turn (no EOS, no stop strings) and then gets an observation of `--obs` tokens, for
`--turns` turns, so every timed rollout has the same shapes (the warm-up rollout compiles them all). Both
cache policies sample the same tokens (tests/agent/test_multiturn.py), so the times compare the same work.
Prints the best of 3 timed rollouts per setting.
"""

from __future__ import annotations

import argparse
import time

from flax import nnx

from jaxrl.models import Transformer, TransformerConfig
from jaxrl.sampling import multiturn


def rollout(graphdef, state, args, mode: str, slots: int, seed: int) -> multiturn.TurnDecoder:
    dec = multiturn.TurnDecoder(graphdef, state, args.episodes, max_new_tokens=args.new, temperature=1.0,
                                seed=seed, mode=mode, cache_slots=slots)
    ctx = [[7 + (i + j) % 90 for j in range(64)] for i in range(args.episodes)]
    obs = [10 + j % 90 for j in range(args.obs)]
    for k in range(args.turns):
        turn = dec.turn(k, ctx, [args.new] * args.episodes)
        ctx = [c + [int(t) for t in turn.tokens[i, : turn.lengths[i]]] + obs for i, c in enumerate(ctx)]
    return dec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--obs", type=int, default=150)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args()
    cfg = TransformerConfig.tiny(vocab_size=128, max_position_embeddings=4096, hidden_size=128, num_layers=4,
                                 num_heads=4, num_kv_heads=4, head_dim=32, mlp_dim=384)
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    total = 64 + args.turns * (args.new + args.obs)
    default = -(-(total + args.turns * args.new) // 128) * 128  # EpisodeBudget's default cache_slots
    settings = [("reprefill", 0), ("continue", 2 * total + args.turns * args.new), ("continue", default)]
    for mode, slots in settings:
        before = multiturn.compile_count()
        rollout(graphdef, state, args, mode, slots, seed=0)  # compiles every shape of the timed runs
        compiles = multiturn.compile_count() - before
        best = float("inf")
        for seed in (1, 2, 3):
            t0 = time.perf_counter()
            dec = rollout(graphdef, state, args, mode, slots, seed)
            best = min(best, time.perf_counter() - t0)
        assert multiturn.compile_count() - before == compiles  # no compile inside the timed runs
        print(f"{mode:9s} slots {slots:5d}: best {best:.3f} s per rollout ({args.episodes} episodes x "
              f"{args.turns} turns x {args.new} new + {args.obs} obs tokens) | prefill tokens "
              f"{dec.stats['prefill_tokens']} | compactions {dec.stats['compactions']} | compiles {compiles}")


if __name__ == "__main__":
    main()
