"""The `UpdateSchedule` plug-in: how one rollout's advantages become optimiser steps.

    Joint    one assemble + update over all the rows (with the algorithm's extra rows, e.g. SFT-aux)
    Phased   one assemble + update per role segment, in order (spec/multi-agent.md §3.8: SSP updates its
             Proposer, then its Solver; per-role adapters: each role's adapters in turn)

Setup (`jaxrl.rl.setup.setup`) picks one; the step (`jaxrl.rl.step.rl_step`) calls it without asking which one
it got. The stages a schedule runs (`jaxrl.rl.batch.assemble`, `update`) are handed to it at setup
(`Stages`), so that this module does not import the batch module, whose `Run` names this one's protocol.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

import numpy as np

from jaxrl.sampling.rollout_rows import take_rows
from jaxrl.types import Rollout
from jaxrl.runtime import step_time
from jaxrl.multi_agent.adapters import role_params
from jaxrl.learner.train_step import TrainBatch, TrainState

if TYPE_CHECKING:
    from jaxrl.rl.run import Run


class Updated(NamedTuple):
    """A schedule's result: the new state, the update and mismatch metrics, and the update's prompt group
    (`TrainBatch.group`, for the step's MFU; 1 for a phased update)."""

    state: TrainState
    metrics: dict[str, float]
    group: int


@dataclasses.dataclass(frozen=True)
class Stages:
    """The trainer's stages a schedule runs: `assemble(run, params, ro, adv, *, extra_rows, recompute_old,
    pad, clock) -> (batch, metrics)` and `update(run, state, batch, step) -> (state, metrics)`."""

    assemble: Callable[..., tuple[TrainBatch, dict[str, float]]]
    update: Callable[..., tuple[TrainState, dict[str, float]]]


class UpdateSchedule(Protocol):
    """(run, state, sampling params, rollout, advantages, the step's records, step, clock; frozen: the actor
    is frozen this step, assemble for the metrics but do not update) -> `Updated`.

    A schedule may train state of its own next to the policy (PPO's critic, `jaxrl.rl.critic.ActorCritic`):
    `begin(policy)` starts it from the model RL starts from (after the SFT warm start; not on resume),
    `arrays()` are the checkpoint items it saves with each step ({} for none) and `load(items)` takes them back
    on resume."""

    def __call__(self, run: Run, state: TrainState, params: Any, ro: Rollout, adv, records,
                 step: int, clock: step_time.StageClock, *, frozen: bool) -> Updated: ...

    def begin(self, policy_params: Any) -> None: ...

    def arrays(self) -> dict[str, Any]: ...

    def load(self, arrays: dict[str, Any]) -> None: ...


class _Stateless:
    """A schedule with no state of its own (nothing to start, save or load)."""

    def begin(self, policy_params: Any) -> None:
        del policy_params

    def arrays(self) -> dict[str, Any]:
        return {}

    def load(self, arrays: dict[str, Any]) -> None:
        del arrays


@dataclasses.dataclass(frozen=True)
class Joint(_Stateless):
    """One update over all the rows. A multi-agent rollout has the trained roles' rows, not prompts x G: they
    are padded to the batch shards x mini-batches with rows that train on nothing (as a phase's are)."""

    stages: Stages

    def __call__(self, run: Run, state: TrainState, params: Any, ro: Rollout, adv, records,
                 step: int, clock: step_time.StageClock, *, frozen: bool) -> Updated:
        extra = None
        if run.algorithm.extra_rows is not None:
            extra = run.algorithm.extra_rows(records, run.tokenizer, ro.prompt_width,
                                             ro.completion_mask_BT.shape[1])
        batch, metrics = self.stages.assemble(run, params, ro, adv, extra_rows=extra,
                                              pad=ro.segment_B is not None, clock=clock)
        del params  # LoRA: the merged policy is not held during the update
        if not frozen:
            with clock("update"):
                view = run.policy.train_view(state, None)
                view, update_metrics = self.stages.update(run, view, batch, step)
                state = step_time.synced(run.policy.with_train_view(state, None, view))
            metrics.update(update_metrics)
        return Updated(state, metrics, batch.group)


@dataclasses.dataclass(frozen=True)
class Phased(_Stateless):
    """The sequential schedule of a multi-agent update: one assemble + update per role segment, in `order`
    (segment ids; None: every segment present, in id order). A later phase takes its old log-probs at the
    policy the previous phase left when `recompute_old` (the reference's "per_phase" timing: its PPO ratios
    start at 1); with per-role adapters no other role's weights changed, so it keeps the sampler's.

    Metrics: `role/<name>/<key>` per phase (update and mismatch); the plain update keys are the phases' mean
    (the non-finite flag: their max), the plain mismatch keys the first phase's (sampler vs trainer before any
    update). Each phase is one optimiser step per mini-batch and epoch. A rollout without role segments, or
    a step whose actor is frozen, updates jointly."""

    stages: Stages
    order: tuple[int, ...] | None
    recompute_old: bool

    def __call__(self, run: Run, state: TrainState, params: Any, ro: Rollout, adv, records,
                 step: int, clock: step_time.StageClock, *, frozen: bool) -> Updated:
        phases = self._phases(ro)
        if not phases or frozen:
            return Joint(self.stages)(run, state, params, ro, adv, records, step, clock, frozen=frozen)
        state, metrics = self._phased(run, state, params, ro, adv, step, phases, clock)
        return Updated(state, metrics, 1)

    def _phases(self, ro: Rollout) -> tuple[int, ...]:
        if ro.segment_B is None:
            return ()
        if self.order is None:
            return tuple(int(x) for x in np.unique(ro.segment_B))
        return self.order

    def _phased(self, run: Run, state: TrainState, params: Any, ro: Rollout, adv, step: int,
                phases: tuple[int, ...], clock: step_time.StageClock) -> tuple[TrainState, dict[str, float]]:
        names = {int(r["role_id"]): str(r["role"]) for r in ro.records}
        out: dict[str, float] = {}
        done: list[dict[str, float]] = []
        for seg in phases:
            rows = np.flatnonzero(ro.segment_B == seg)
            if not rows.size:
                continue
            if done:
                with clock("weight_sync"):
                    params = step_time.synced(run.policy.sampling_params(state.params))
            sub = adv._replace(adv_BT=adv.adv_BT[rows], clip_low_B=adv.clip_low_B[rows],
                               clip_high_B=adv.clip_high_B[rows])
            role = names[seg]
            batch, mismatch = self.stages.assemble(run, role_params(params, role),
                                                   take_rows(ro, rows), sub,
                                                   recompute_old=bool(done) and self.recompute_old, pad=True,
                                                   clock=clock)
            with clock("update"):
                view, update = self.stages.update(run, run.policy.train_view(state, role), batch, step)
                state = step_time.synced(run.policy.with_train_view(state, role, view))
            if not done:
                out.update(mismatch)
            out.update({f"role/{role}/{k}": v for k, v in {**mismatch, **update}.items()})
            done.append(update)
        return state, _phase_means(out, done)


def _phase_means(out: dict[str, float], done: list[dict[str, float]]) -> dict[str, float]:
    """`out` with the plain update keys: the phases' mean (the non-finite flag: their max)."""
    for key in done[0] if done else ():
        values = [d[key] for d in done]
        out[key] = float(max(values)) if key == "train/nonfinite" else float(np.mean(values))
    return out
