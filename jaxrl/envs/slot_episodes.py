"""Multi-turn episodes on the continuous slot engine (`jaxrl.sampling.episode_slots`): the host scheduler.

    pending = the episodes in order; every slot free
    loop:
        each waiting slot is fed its episode's observation (turn k + 1); each free slot takes the next
            pending episode (its prompt, turn 0); one feed call for all of them
        stop when no slot holds an episode
        advance(): decode until no slot decodes or enough slots ended their turn
        each slot whose turn ended: its action steps the episode's environment (`act`); a finished episode
            frees its slot (refilled at the top of the loop), any other one keeps it and waits

A turn waiting for its environment frees nothing: the slot and its KV cache stay with the episode. Episode i
draws as row `rows[i]` at its own turn index, so its tokens are those of the lockstep `TurnDecoder` loop of
`jaxrl.envs.collect_episodes` (cache "continue"), whatever slot it lands in and whenever it is admitted.

Hosts: with a `by_host` decoder every host runs this loop over its own episodes (the others are None) and its
own slots (`SlotDecoder.owned_S`): it admits its episodes in order into its slots only and steps only their
environments. Feed and advance are collectives, so the hosts agree each round (one exchange of two counts)
whether any host feeds (then all call `feed`, some with nothing) and whether any slot is still held (else
all stop together).
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Sequence

import numpy as np

from jaxrl.sampling.episode_slots import SlotDecoder
from jaxrl.sharding import hosts


class SlotScheduler:
    """Drives N episodes through the S slots of a `SlotDecoder` (module docstring).

    Args:
      decoder: the slot engine (S slots).
      episodes: N objects with `context` (list of token ids), `rewards` (one per finished turn) and `done`;
        done ones are never admitted; None: another host's episode (with a `by_host` decoder).
      rows: [N] the episodes' global row ids (their random draws).
      max_new_tokens, max_total_tokens: a turn's budget is min(max_new_tokens, max_total_tokens - context).
    """

    def __init__(self, decoder: SlotDecoder, episodes: Sequence, rows: Sequence[int], *, max_new_tokens: int,
                 max_total_tokens: int):
        if len(rows) != len(episodes):
            raise ValueError(f"rows must hold {len(episodes)} row ids, got {len(rows)}")
        self.decoder, self.eps, self.rows = decoder, list(episodes), [int(r) for r in rows]
        self.max_new, self.max_total = int(max_new_tokens), int(max_total_tokens)
        self.pending = collections.deque(i for i, e in enumerate(self.eps) if e is not None and not e.done)
        self.slot_ep = np.full((decoder.num_slots,), -1, np.int64)  # the episode each slot holds (-1: free)
        self.waiting: list[int] = []  # held slots whose episode goes on: fed at the next `_fill`
        self.admitted: list[tuple[int, int]] = []  # (episode, slot) in admission order
        self.timing = {"generate_s": 0.0, "env_s": 0.0}

    def _budget(self, e) -> int:
        return min(self.max_new, self.max_total - len(e.context))

    def _fill(self) -> bool:
        """Feeds every waiting slot its next turn and every free slot of this host the next pending episode (one
        call, made by every host when any host feeds); returns whether any host still holds a slot."""
        feeds = [(s, self.eps[self.slot_ep[s]], False) for s in self.waiting]
        self.waiting = []
        for s in np.flatnonzero((self.slot_ep < 0) & self.decoder.owned_S):
            while self.pending:
                i = self.pending.popleft()
                e = self.eps[i]
                if self._budget(e) <= 0:
                    e.done = True
                    continue
                self.slot_ep[s] = i
                self.admitted.append((i, int(s)))
                feeds.append((int(s), e, True))
                break
        counts = np.asarray([len(feeds), np.any(self.slot_ep >= 0)], np.int64)
        if self.decoder.by_host:  # feed and advance are collectives: every host takes the same branches
            counts = hosts.sum_across_hosts(counts)
        if counts[0]:
            t0 = time.perf_counter()
            self.decoder.feed([s for s, _, _ in feeds], [e.context for _, e, _ in feeds],
                              [self.rows[self.slot_ep[s]] for s, _, _ in feeds], [len(e.rewards) for _, e, _ in feeds],
                              [self._budget(e) for _, e, _ in feeds], [new for _, _, new in feeds])
            self.timing["generate_s"] += time.perf_counter() - t0
        return bool(counts[1])

    def run(self, act: Callable[[int, list[int], list[float]], None]) -> None:
        """Runs every episode to its end; `act(i, ids, logprobs)` applies episode i's sampled action (it steps
        the environment and extends `context`, or sets `done`)."""
        while self._fill():
            t0 = time.perf_counter()
            turns = self.decoder.advance()
            t1 = time.perf_counter()
            for s in np.flatnonzero(turns.ended):
                i, n = int(self.slot_ep[s]), int(turns.lengths[s])
                e = self.eps[i]
                act(i, [int(x) for x in turns.tokens[s, :n]], [float(x) for x in turns.logprobs[s, :n]])
                e.done = e.done or self._budget(e) <= 0
                if e.done:
                    self.slot_ep[s] = -1  # a finished episode frees its slot
                else:
                    self.waiting.append(int(s))
            self.timing["generate_s"] += t1 - t0
            self.timing["env_s"] += time.perf_counter() - t1
