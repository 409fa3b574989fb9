"""Partial rollouts (`train.async.partial_rollouts: true`, issue 27 item 3): a completion still in flight when
new weights arrive continues under them.

With max_staleness k >= 1 (`jaxrl.rl.ahead`) the rollout of step s is launched before the update of step
s − 1 with version b(s) = max(s − 1 − k, floor). `Partial` splits that collection at token

    split = ⌈T / 2⌉        (T = rollout.max_new_tokens)

    segment 0, at launch (background thread or in place, as `Ahead`): version b(s) decodes every row up to
      `split` tokens (`SingleTurn.first_segment`: the same key, so the same first tokens as the whole row);
    segment 1, at `take(s)`, after the update of step s − 1 made version s − 1: the rows that reached `split`
      without an EOS are prefilled again (prompt + first segment) under version s − 1 and decode the rest of
      their budget with the key stream fold_in(key, 1) (`collect.resume`); then every row is decoded to text
      and scored (`collect.Continuation`, through the step's timed collection: the trainer waits for it, so it
      counts in `time/exposed_generation`).

Token t of row r was sampled by version b(s) if t < split (or the row ended in segment 0), else s − 1: the
rollout's `version_BT`. Its token staleness (s − 1) − version_BT is reported over the completion tokens as
`async/token_staleness_mean` / `_max` (<= `async/staleness_max` <= k; 0 for continued tokens). The rollout's
old log-probs are the sampler's per-token log-probs, each under the version that sampled its token, so the
PPO ratio π_θ / π_behaviour is per-token correct; with `algorithm.mismatch.mode: tis | mis` the correction
π_prox / π_behaviour applies on top (decoupled PPO, AReaL: Fu et al. 2025, arXiv:2505.24298). References for
the schedule: Kimi k1.5's "partial rollouts" (arXiv:2501.12599) and slime's SGLang-based partial
rollouts, which re-prefill an interrupted sequence under the new weights.

Exact resume: a checkpoint after step s − 1 holds the launch of step s (records, version b(s)) and the
sampler's copy of b(s) (`Ahead.checkpoint`); the resumed run collects segment 0 again with that copy and
segment 1 with the restored parameters (version s − 1), both deterministic, so it trains as an uninterrupted
run would.

Single-turn only (an episode or a role turn is not continued: `env:` / `multi_agent:` are refused at load), and
not with an algorithm that draws more groups after the step began (DAPO's dynamic sampling needs whole
groups from one policy version): both refused at load (`jaxrl.config.experiment`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl.rl.ahead import Ahead, CollectFn, Synchronous
from jaxrl.rl.collect import continuing_rows
from jaxrl.rl.step import step_key
from jaxrl.runtime import step_time
from jaxrl.types import Rollout


def split_point(max_new_tokens: int) -> int:
    """The first segment's token budget: ⌈T / 2⌉."""
    return -(-int(max_new_tokens) // 2)


def versions_BT(boundary_B: np.ndarray, width: int, behaviour: int, newest: int) -> np.ndarray:
    """int32 [B, T]: `behaviour` before each row's boundary (its first segment's length if it continued, else
    T: the whole row), `newest` from it on."""
    return np.where(np.arange(width)[None, :] < np.asarray(boundary_B)[:, None], behaviour,
                    newest).astype(np.int32)


def token_staleness(version_BT: np.ndarray, cmask_BT: np.ndarray, trainer_version: int) -> dict[str, float]:
    """Mean and max of trainer_version − version over the completion tokens."""
    stale_BT = trainer_version - np.asarray(version_BT, np.float64)
    mask_BT = np.asarray(cmask_BT, bool)
    if not mask_BT.any():
        return {"async/token_staleness_mean": 0.0, "async/token_staleness_max": 0.0}
    return {"async/token_staleness_mean": float(stale_BT[mask_BT].mean()),
            "async/token_staleness_max": float(stale_BT[mask_BT].max())}


class Partial(Ahead):
    """`Ahead` whose launches sample the first segment only; `take` continues the rows in flight under the
    trainer's newest version and scores them (module docstring)."""

    def _collect_ahead(self, run, params, records, step: int, collect: CollectFn, own: step_time.StageClock):
        del collect
        with own("generation"):
            return run.collector.first_segment(params, records, run.sampling, step_key(run.seed, step, 0),
                                               split_point(run.sampling.max_new_tokens))

    def _finish(self, run, got, version: int, policy, records, step: int, collect: CollectFn,
                clock: step_time.StageClock) -> tuple[Rollout, dict[str, float]]:
        split = split_point(run.sampling.max_new_tokens)
        ro = collect(policy, records, step, clock, collector=run.collector.continuation(got, split))
        width = ro.completion_mask_BT.shape[1]
        going_B = continuing_rows(got, split, run.sampling.max_new_tokens)
        version_BT = versions_BT(np.where(going_B, got.lengths_B, width), width, version, step - 1)
        metrics = token_staleness(version_BT, ro.completion_mask_BT, step - 1)
        metrics["async/continued_frac"] = float(going_B.mean())  # the rows segment 1 decoded on
        return dataclasses.replace(ro, version_BT=version_BT), metrics



def make_feed(max_staleness: int, *, processes: int, devices: int, own_sampler_devices: bool = False,
              partial: bool = False):
    """The run's feed: `Synchronous` for k = 0; `Ahead` otherwise (`Partial` with `partial`: partial
    rollouts), overlapping with one process when the sampler and the trainer share no device (one device, or
    `mesh.rollout_devices`: `jaxrl.rl.placement`). Here, above both feeds, so that `ahead` imports neither."""
    if max_staleness == 0:
        return Synchronous()
    overlap = processes == 1 and (devices == 1 or own_sampler_devices)
    return (Partial if partial else Ahead)(max_staleness, overlap=overlap)
