"""Re-prefill vs KV-cache continuation for multi-turn rollouts (not a test; run by hand, ~1-2 minutes on CPU).

    .venv/bin/python tests/agent/bench_multiturn.py [--episodes 16] [--turns 4] [--obs 150] [--new 32]

A quickstart-sized model (4 layers, D=128, random weights) and a scripted environment that always answers
with an observation of `--obs` characters (a search result's size) until `--turns` turns; both cache modes
sample the same tokens (tests/agent/test_multiturn.py), so the times compare the same work. Prints the best
of 3 timed rollouts per mode after one warm-up (compile) rollout.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
from agent_helpers import EchoEnv  # noqa: E402

from jaxrl.envs import EpisodeSpec, collect_episodes  # noqa: E402
from jaxrl.models import Transformer, TransformerConfig  # noqa: E402
from jaxrl.tokenizer import builtin_tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--obs", type=int, default=150)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args()
    tok = builtin_tokenizer()
    cfg = TransformerConfig.tiny(vocab_size=128, max_position_embeddings=4096, hidden_size=128, num_layers=4,
                                 num_heads=4, num_kv_heads=4, head_dim=32, mlp_dim=384)
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    obs = ("<result>" + "Quenby is a city in Ostrava Vale. " * 10)[: args.obs - 9] + "</result>"
    records = [{"question": f"Question number {i}: where is Quenby?", "turns": args.turns,
                "obs": [obs] * args.turns} for i in range(args.episodes // 2)]
    factory = functools.partial(EchoEnv, stops=())
    total = 64 + args.turns * (args.new + args.obs + 16)
    for mode in ("reprefill", "continue"):
        spec = EpisodeSpec(group_size=2, max_turns=args.turns, max_new_tokens=args.new,
                           max_total_tokens=total, temperature=1.0, cache=mode)
        collect_episodes(graphdef, state, records, tok, factory, spec, seed=0)  # compile
        best, ep = float("inf"), None
        for seed in (1, 2, 3):
            t0 = time.perf_counter()
            ep = collect_episodes(graphdef, state, records, tok, factory, spec, seed=seed)
            best = min(best, time.perf_counter() - t0)
        m = ep.metrics
        print(f"{mode:9s}: best {best:.3f} s per rollout of {args.episodes} episodes"
              f" | turns {m['episode/turns']:.2f} | action tokens {m['episode/action_tokens']:.1f}"
              f" | obs tokens {m['episode/obs_tokens']:.1f}"
              f" | prefill tokens {m['rollout/prefill_tokens']:.0f}"
              f" | compactions {m['rollout/cache_compactions']:.0f}")


if __name__ == "__main__":
    main()
