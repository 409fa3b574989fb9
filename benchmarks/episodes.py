"""Multi-turn episodes: the continuous slot engine vs the lockstep turn decoder (issue 33 item 2).

    .venv/bin/python benchmarks/episodes.py                     # 64 episodes, 1-4 turns, actions 8..256
    .venv/bin/python benchmarks/episodes.py --slots 64,32 --repeats 2

The workload: N episodes, episode e runs K_e turns (K_e uniform in 1..--turns); its action at turn k is made to
stop after a long-tailed number of tokens A_{e,k} = min(max, ⌊min / U⌋) (`continuous.long_tailed_lengths`),
as the turn's token budget (no EOS: a random model); every observation is --obs random tokens. Both engines
sample (τ = 1) from the same random fp32 Qwen3 (`continuous.random_qwen3`) with the same seed, so they make
the same tokens (tests/sampling/test_episode_slots.py); useful tokens = Σ A_{e,k}, tokens/s = useful tokens /
wall time of the whole rollout (the host loop included; there is no environment work).

- lockstep: `jaxrl.sampling.multiturn.TurnDecoder` (cache "continue"), one `turn` call per turn index for all
  live episodes: each turn costs the batch's longest action.
- slots S: `jaxrl.sampling.episode_slots.SlotDecoder` driven as `jaxrl.envs.slot_episodes.SlotScheduler`
  drives it: a waiting slot is fed its observation, a finished episode's slot the next pending episode.

Each engine is timed once per round, round-robin, for --repeats rounds after a warm-up rollout (compiles);
the best round is kept. Also printed: decode steps, and slot use = Σ A / (decode steps x rows per step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from continuous import long_tailed_lengths, random_qwen3  # noqa: E402  (benchmarks/continuous.py)


def workload(episodes: int, turns: int, lo: int, hi: int, prompt: int, obs: int, vocab: int, seed: int = 0):
    """(prompts [N] token lists, turn budgets [N] lists of A_{e,k}, observations [N][K_e] token lists)."""
    rng = np.random.default_rng(seed)
    count_N = rng.integers(1, turns + 1, size=episodes)
    flat = long_tailed_lengths(int(count_N.sum()), lo, hi, seed=seed + 1)
    budgets, start = [], 0
    for k in count_N:
        budgets.append([int(a) for a in flat[start:start + k]])
        start += k
    prompts = [list(map(int, rng.integers(3, vocab, size=prompt))) for _ in range(episodes)]
    observations = [[list(map(int, rng.integers(3, vocab, size=obs))) for _ in b] for b in budgets]
    return prompts, budgets, observations


def run_lockstep(graphdef, params, prompts, budgets, observations, hi: int, seed: int) -> dict:
    """Every live episode decodes each turn together; returns {tokens, steps, seconds, contexts}."""
    from jaxrl.sampling.multiturn import TurnDecoder

    n = len(prompts)
    longest = max(len(p) + sum(b) + sum(map(len, o)) for p, b, o in zip(prompts, budgets, observations))
    turns = max(map(len, budgets))  # `collect_episodes`' default capacity: the longest context + a buffer a turn
    capacity = -(-(longest + turns * hi) // 128) * 128
    dec = TurnDecoder(graphdef, params, n, max_new_tokens=hi, temperature=1.0, seed=seed, mode="continue",
                      cache_slots=capacity, chunk_buckets=None, gen_buckets=None)
    contexts = [list(p) for p in prompts]
    t0, made, steps = time.perf_counter(), 0, 0
    for k in range(max(len(b) for b in budgets)):
        live = [k < len(b) for b in budgets]
        turn = dec.turn(k, [c if ok else None for c, ok in zip(contexts, live)],
                        [b[k] if ok else 0 for b, ok in zip(budgets, live)])
        steps += int(turn.lengths.max(initial=0))
        for e in range(n):
            if live[e]:
                got = int(turn.lengths[e])
                made += got
                contexts[e] += [int(x) for x in turn.tokens[e, :got]] + observations[e][k]
    return dict(tokens=made, steps=steps, rows=n, seconds=time.perf_counter() - t0, contexts=contexts)


def run_slots(graphdef, params, prompts, budgets, observations, hi: int, seed: int, slots: int) -> dict:
    """S slots: a waiting slot is fed its next observation, a finished episode's slot the next episode."""
    from jaxrl.sampling.episode_slots import SlotDecoder

    n = len(prompts)
    longest = max(len(p) + sum(b) + sum(len(o) for o in obs) for p, b, obs in zip(prompts, budgets, observations))
    dec = SlotDecoder(graphdef, params, slots, max_context=longest, max_new_tokens=hi, temperature=1.0,
                      seed=seed, gen_buckets=None)
    contexts = [list(p) for p in prompts]
    turn_N = [0] * n
    slot_ep = [-1] * slots
    pending = list(range(n))[::-1]
    waiting: list[int] = []
    t0, made = time.perf_counter(), 0
    while True:
        feeds = [(s, False) for s in waiting]
        waiting = []
        for s in range(slots):
            if slot_ep[s] < 0 and pending:
                slot_ep[s] = pending.pop()
                feeds.append((s, True))
        if feeds:
            eps = [slot_ep[s] for s, _ in feeds]
            dec.feed([s for s, _ in feeds], [contexts[e] for e in eps], eps, [turn_N[e] for e in eps],
                     [budgets[e][turn_N[e]] for e in eps], [new for _, new in feeds])
        if all(e < 0 for e in slot_ep):
            break
        out = dec.advance()
        for s in np.flatnonzero(out.ended):
            e, got = slot_ep[s], int(out.lengths[s])
            made += got
            contexts[e] += [int(x) for x in out.tokens[s, :got]]
            if turn_N[e] + 1 < len(budgets[e]):
                contexts[e] += observations[e][turn_N[e]]
                turn_N[e] += 1
                waiting.append(int(s))
            else:
                contexts[e] += observations[e][turn_N[e]]
                slot_ep[s] = -1
    return dict(tokens=made, steps=dec.stats["decode_steps"], rows=slots, seconds=time.perf_counter() - t0,
                contexts=contexts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--min", type=int, default=8)
    ap.add_argument("--max", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--obs", type=int, default=16)
    ap.add_argument("--slots", default="64,32", help="comma-separated slot counts")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from flax import nnx

    _, model = random_qwen3(args.hidden, args.layers, args.vocab)
    graphdef, params = nnx.split(model)
    prompts, budgets, obs = workload(args.episodes, args.turns, args.min, args.max, args.prompt, args.obs,
                                     args.vocab)
    engines = {"lockstep": lambda: run_lockstep(graphdef, params, prompts, budgets, obs, args.max, 0)}
    for s in (int(x) for x in args.slots.split(",")):
        engines[f"slots {s}"] = lambda s=s: run_slots(graphdef, params, prompts, budgets, obs, args.max, 0, s)
    warm = {name: fn() for name, fn in engines.items()}  # compiles
    same = all(w["contexts"] == warm["lockstep"]["contexts"] for w in warm.values())
    best = {name: None for name in engines}
    for _ in range(args.repeats):
        for name, fn in engines.items():
            r = fn()
            if best[name] is None or r["seconds"] < best[name]["seconds"]:
                best[name] = r
    useful = sum(map(sum, budgets))
    base = useful / best["lockstep"]["seconds"]
    report = dict(episodes=args.episodes, turns=sum(map(len, budgets)), useful_tokens=useful,
                  same_tokens=same, engines={})
    print(f"{args.episodes} episodes, {report['turns']} turns, {useful} action tokens (long-tailed "
          f"{args.min}..{args.max}), same tokens on every engine: {same}")
    for name, r in best.items():
        rate = useful / r["seconds"]
        use = useful / max(r["steps"] * r["rows"], 1)
        report["engines"][name] = dict(seconds=r["seconds"], tokens_per_s=rate, decode_steps=r["steps"],
                                       slot_use=use, vs_lockstep=rate / base)
        print(f"  {name:10s} {r['seconds']:7.2f} s  {rate:7.0f} tok/s  ({rate / base:.2f}x lockstep)  "
              f"{r['steps']:5d} decode steps  slot use {use:.2f}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
