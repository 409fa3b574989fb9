"""Where a step's rollout comes from (`train.async.max_staleness: k`): collected now by the trainer's policy
(`Synchronous`, k = 0, the default), or collected ahead by a policy up to k updates older (`Ahead`, k >= 1).

Versions: the trained parameters are version v after v updates (step s begins at version s − 1; version 0 is
the state RL starts from). With k >= 1 the rollout of step s is sampled by version

    b(s) = max(s − 1 − k, floor),     staleness(s) = (s − 1) − b(s) = min(s − 1 − floor, k) <= k,

floor = 0 for a fresh run (the first k steps are fresher than k). Because b(s + 1) <= s − 1, the rollout of
step s + 1 does not depend on the update of step s: `Ahead.launch` starts it before that update, so the host
work of collecting (decoding loops, rewards, environments, tokenisation) overlaps the update on the devices.
The sampler keeps its own copies of the versions it still needs (k copies of the trained parameters, k + 1
for a moment; LoRA: adapters only), made before an update donates the state (`time/weight_sync`).

Overlap runs the collection in one background thread, only where that is safe: one process whose sampler
shares no device with the trainer (one device, or `mesh.rollout_devices`, `jaxrl.rl.placement`). With shared
devices, programs with collectives dispatched from two threads may enter them in different orders (on CPU
with gloo across processes that hangs; `jaxrl.rl.batch`), so there the collection runs in place at launch:
the same rollouts and numbers, without the overlap.

Timing: a rollout's own collection stages (`time/generation`, `time/reward`, `time/env`) are reported at the
step that trains on it, and `time/exposed_generation` is what the trainer waited for it; collected in place,
that wait happened during the previous step (before its update), so it moves by one step, not in the sum.

Off-policy correction: the rollout's old log-probs are the sampler's (`rollout.logprobs_from_sampler`), so the
PPO ratio is π_θ / π_behaviour. With `algorithm.mismatch.mode: tis | mis` the old log-probs are recomputed at
the trainer's current policy (the proximal policy) and the behaviour correction π_prox / π_behaviour weights
(TIS) or masks (MIS) each token: the decoupled PPO objective of AReaL (Fu et al. 2025, arXiv:2505.24298).

Partial rollouts (`train.async.partial_rollouts`, `jaxrl.rl.partial.Partial`, a subclass): a launch decodes
only the first half of each row's budget; `take` continues the rows in flight under the newest version
(hooks `_collect_ahead` / `_finish`). `jaxrl.rl.partial.make_feed` picks the run's feed.

Exact resume: a checkpoint after step s holds the sampler's versions b(s + 1) .. s − 1 (the item `behind`), and
for the rollout already launched, its records and the collector's state before it; the resumed run collects
that rollout again (collections are deterministic in (params, records, step)), so it continues as an
uninterrupted run would.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxrl.types import Rollout
from jaxrl.runtime import step_time
from jaxrl.learner.train_step import TrainState

log = logging.getLogger(__name__)
# (params, records, step, clock) -> rollout: `jaxrl.rl.step`'s timed collection of one step
CollectFn = Callable[[Any, Any, int, step_time.StageClock], Rollout]


@dataclasses.dataclass
class Taken:
    """A step's rollout, the sampling parameters that collected it (DAPO's extra rounds use them too), the
    trainer's current sampling parameters, and the async metrics."""

    rollout: Rollout
    behaviour: Any
    policy: Any
    metrics: dict[str, float]


def pending_records(restored) -> dict[int, Any]:
    """step -> records of the rollouts an async run had launched when it wrote the checkpoint `restored`: the
    data iterator was saved past them, so whatever feed resumes must train on them first."""
    pending = (restored.extra.get("async") or {}).get("pending", {})
    return {int(s): p["records"] for s, p in pending.items()}


class Synchronous:
    """k = 0: the step's rollout is collected now by the trainer's policy (today's step, exactly)."""

    max_staleness = 0

    def __init__(self):
        self._saved: dict[int, Any] = {}  # step -> records launched by the async run that wrote the checkpoint

    def records_for(self, step: int, draw: Callable[[], Any]):
        return self._saved.pop(step) if step in self._saved else draw()

    def take(self, run, state: TrainState, records, step: int, collect: CollectFn,
             clock: step_time.StageClock) -> Taken:
        with clock("weight_sync"):  # the full parameters (LoRA: base + adapters, merged once per step)
            policy = step_time.synced(run.policy.sampling_params(state.params))
        return Taken(collect(policy, records, step, clock), policy, policy, {})

    def launch(self, run, step: int, draw: Callable[[], Any] | None, collect: CollectFn) -> None:
        del run, step, draw, collect

    def collector_state(self, collector) -> Any:
        return collector.state_json()

    def settle(self) -> None:
        pass

    def checkpoint(self, step: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        del step
        return None, {}

    def restore(self, ckpt, restored, params_like) -> None:
        del ckpt, params_like
        self._saved = pending_records(restored)

    def close(self) -> None:
        pass


@dataclasses.dataclass
class _Launch:
    records: Any
    collector_state: Any  # the collector's state before this collection (what a checkpoint keeps)
    version: int
    result: concurrent.futures.Future
    inline_s: float = 0.0  # seconds it took when collected in place (the trainer waited for all of them)


class Ahead:
    """k >= 1: step s's rollout is sampled by version b(s) (module docstring), collected during step s − 1."""

    def __init__(self, max_staleness: int, *, overlap: bool):
        if max_staleness < 1:
            raise ValueError(f"Ahead needs max_staleness >= 1, got {max_staleness}")
        self.max_staleness = max_staleness
        self.overlap = overlap
        self._floor = 0  # the oldest version this invocation can sample with
        self._versions: dict[int, Any] = {}  # version -> the sampler's copy of the trained parameters
        self._launched: dict[int, _Launch] = {}  # step -> its collection, started ahead
        self._saved: dict[int, tuple[Any, int]] = {}  # step -> (records, version) of a restored launch
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "jaxrl-ahead") if overlap else None

    def version(self, step: int) -> int:
        """b(step): the parameter version that samples step `step`'s rollout."""
        return max(step - 1 - self.max_staleness, self._floor)

    def records_for(self, step: int, draw: Callable[[], Any]):
        if step in self._launched:
            return self._launched[step].records
        if step in self._saved:
            return self._saved[step][0]
        return draw()

    def take(self, run, state: TrainState, records, step: int, collect: CollectFn,
             clock: step_time.StageClock) -> Taken:
        with clock("weight_sync"):  # the sampler's copy of this version, before the update donates it
            if step - 1 not in self._versions:
                self._versions[step - 1] = step_time.synced(jax.tree.map(jnp.copy, state.params))
            policy = step_time.synced(run.policy.sampling_params(state.params))
        if step not in self._launched:  # the first step of this invocation: collected now
            version = self._saved.pop(step, (None, self.version(step)))[1]
            self._start(run, step, records, version, collect, inline=True)
        launch = self._launched.pop(step)
        t0 = time.perf_counter()
        got, own = launch.result.result()
        for stage, seconds in own.seconds.items():
            clock.add(stage, seconds)
        ro, metrics = self._finish(run, got, launch.version, policy, records, step, collect, clock)
        exposed = time.perf_counter() - t0 + launch.inline_s
        stale = float(step - 1 - launch.version)
        behaviour = run.policy.sampling_params(self._versions[launch.version])
        for old in [v for v in self._versions if v < self.version(step + 1)]:
            del self._versions[old]  # no later step samples with it
        metrics.update({"async/staleness_mean": stale, "async/staleness_max": stale,
                        "async/behaviour_version": float(launch.version), "time/exposed_generation": exposed})
        return Taken(ro, behaviour, policy, metrics)

    def _collect_ahead(self, run, params, records, step: int, collect: CollectFn, own: step_time.StageClock):
        """What a launch computes with the sampling parameters `params` of its version: the whole rollout."""
        return collect(params, records, step, own)

    def _finish(self, run, got, version: int, policy, records, step: int, collect: CollectFn,
                clock: step_time.StageClock) -> tuple[Rollout, dict[str, float]]:
        """(the step's rollout, its metrics) from what its launch computed (`_collect_ahead`): as it is."""
        del run, version, policy, records, step, collect, clock
        return got, {}

    def launch(self, run, step: int, draw: Callable[[], Any] | None, collect: CollectFn) -> None:
        """Starts collecting step `step`'s rollout (call before the update of step − 1); `draw` gives its
        records (None: no such step)."""
        if draw is None:
            return
        records = self.records_for(step, draw)
        self._start(run, step, records, self.version(step), collect, inline=not self.overlap)

    def _start(self, run, step: int, records, version: int, collect: CollectFn, *, inline: bool) -> None:
        params = self._versions[version]

        def work():
            own = step_time.StageClock()
            return self._collect_ahead(run, run.policy.sampling_params(params), records, step, collect, own), own

        before = run.collector.state_json()
        t0 = time.perf_counter()
        if inline:
            result: concurrent.futures.Future = concurrent.futures.Future()
            result.set_result(work())
        else:
            result = self._pool.submit(work)
        inline_s = time.perf_counter() - t0 if inline else 0.0
        self._launched[step] = _Launch(records, before, version, result, inline_s)

    def settle(self) -> None:
        """Waits until no collection runs (before the held-out evaluation, which uses the same collector,
        rewards and environments on this thread)."""
        for launch in self._launched.values():
            launch.result.exception()

    def collector_state(self, collector) -> Any:
        """The collector's state a checkpoint keeps: before the collection launched ahead, if one is."""
        if self._launched:
            return self._launched[min(self._launched)].collector_state
        return collector.state_json()

    def checkpoint(self, step: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(the `behind` item: the versions later steps sample with, other than the saved state's own; the
        JSON of the launched rollouts) after step `step`."""
        behind = {f"v{v}": p for v, p in sorted(self._versions.items()) if v < step}
        pending = {str(s): {"records": launch.records, "version": launch.version}
                   for s, launch in sorted(self._launched.items())}
        return behind or None, {"async": {"max_staleness": self.max_staleness, "versions": sorted(
            v for v in self._versions if v < step), "pending": pending}}

    def restore(self, ckpt, restored, params_like) -> None:
        """The sampler's versions and launched rollouts of the checkpoint `restored` (a checkpoint without
        them, e.g. of a synchronous run, restarts the staleness from the restored step, with one log line)."""
        saved = restored.extra.get("async")
        start = restored.step
        if not saved or saved.get("max_staleness") != self.max_staleness:
            self._floor = start
            self._saved = {s: (records, self.version(s)) for s, records in pending_records(restored).items()}
            log.info("train.async.max_staleness=%d: the checkpoint of step %d %s; the rollouts of the next steps "
                     "are sampled from step %d on", self.max_staleness, start,
                     "was written by a synchronous run" if not saved else
                     f"was written with max_staleness={saved.get('max_staleness')}", start)
            return
        versions = [int(v) for v in saved["versions"]]
        if versions:
            behind = ckpt.restore_behind(start, params_like, [f"v{v}" for v in versions])
            self._versions = {v: behind[f"v{v}"] for v in versions}
        self._floor = min(versions, default=start)
        self._saved = {int(s): (p["records"], int(p["version"])) for s, p in saved["pending"].items()}

    def close(self) -> None:
        """Waits for a collection still running (a run stopped by a signal after launching the next)."""
        self.settle()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

