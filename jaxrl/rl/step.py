"""One RL step as a straight line of stages, each a call (the `Run` holds everything they need):

    collect -> resample (DAPO) -> shape rewards (CLIPO bonus, KL in reward) -> advantages
            -> the update schedule: assemble (+ extra rows: SFT-aux) -> update, jointly or per role

Which optional stages run is the algorithm record's business (`jaxrl.algorithms`); this function never names
an algorithm. Each stage is timed between device syncs (`jaxrl.runtime.step_time`): the step's metrics hold
`time/<stage>` for every stage of `step_time.STAGES`, tokens/s per device of generation and update, and the
update's MFU where the device's peak FLOP/s is known.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxrl.types import Rollout
from jaxrl.runtime import step_time
from jaxrl.algorithms import combined_reward, segment_advantages, zero_std_group_frac
from jaxrl.rl.run import Run
from jaxrl.learner.objectives import OBJECTIVES
from jaxrl.learner.train_step import TrainState

TIMING_PREFIX = "time/"
# A collector's own stage times in its rollout's metrics -> the stage they belong to (`_collect_timed`).
_COLLECTOR_TIMES = {"time/generation": "generation", "time/reward": "reward", "time/generate_s": "generation",
                    "time/env_s": "env", "time/weight_sync": "weight_sync"}


def step_key(seed: int, step: int, stream: int) -> jax.Array:
    """The PRNG key of one random stream of one step: every random choice of a run derives from (seed, step)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), stream)


def total_reward(ro: Rollout) -> np.ndarray:
    """The weighted sum of a rollout's rewards per sample, with skipped (NaN) rewards counted as 0."""
    return combined_reward(np.nan_to_num(ro.rewards_BR), ro.weights_R)


def collect(run: Run, params, records, step: int, round_: int = 0, collector=None) -> Rollout:
    """Stage 1: the run's collector (`jaxrl.rl.collect`): G completions, episodes or role rows per prompt,
    decoded and scored (round > 0: a resampling round's fresh seed). `collector`: one the feed gives instead
    of the run's (partial rollouts: the continuation of rows launched ahead, `jaxrl.rl.partial`)."""
    stream = 0 if round_ == 0 else 100 + round_
    return (collector or run.collector)(params, records, run.sampling, step_key(run.seed, step, stream), train=True)


def _collect_timed(clock: step_time.StageClock, collect_fn, round_: int) -> Rollout:
    """`collect_fn(round_)` with its seconds split into stages: what the collector measured itself (the
    single-turn sampler and scoring, the multi-turn sampler and environments) goes to its stage; the rest goes
    to reward when the collector timed its sampler but not its scoring (multi-turn: scoring and assembly),
    else to generation (a multi-agent system's collect is all generation)."""
    with clock("collect"):
        ro = collect_fn(round_)
        step_time.synced((ro.tokens_BL, ro.old_logp_BT))
    total = clock.seconds.pop("collect")
    own = {stage: 0.0 for stage in ("generation", "reward", "env")}  # weight_sync: only when it was measured
    for key, stage in _COLLECTOR_TIMES.items():
        if key in ro.metrics:
            own[stage] = own.get(stage, 0.0) + float(ro.metrics.pop(key))
    rest = max(total - sum(own.values()), 0.0)
    own["reward" if own["generation"] and not own["reward"] else "generation"] += rest
    for stage, seconds in own.items():
        clock.add(stage, seconds)
    return ro


def _throughput(run: Run, ro: Rollout, clock: step_time.StageClock, group: int,
                epochs: int) -> dict[str, float]:
    """Tokens/s per device of generation and update, with NeMo RL's count (the real prompt + completion tokens
    of the step's rows, once per stage), and the update's MFU (model FLOPs: prompts once per group when the
    update shares them, `epochs` passes) where the device's peak FLOP/s is known."""
    mask_BL = np.asarray(ro.mask_BL)
    tokens = float(mask_BL.sum())
    devices = jax.device_count()
    out = {}
    for stage in ("generation", "update"):
        seconds = clock.seconds.get(stage, 0.0)
        out[f"throughput/tokens_per_s_per_device/{stage}"] = tokens / devices / seconds if seconds else 0.0
    peak = step_time.peak_flops(jax.devices()[0].device_kind)
    seconds = clock.seconds.get("update", 0.0)
    if peak and seconds and run.flops_per_token is not None:
        prompt = float(mask_BL[:, :ro.prompt_width].sum())
        model_tokens = tokens - prompt + prompt / group
        context = tokens / max(mask_BL.shape[0], 1) / 2  # causal: a token attends to half its row on average
        flops = epochs * model_tokens * run.flops_per_token(context)
        out["throughput/mfu/update"] = flops / (seconds * devices * peak)
    return out


def _collect_now(run: Run, params, records, step: int, clock: step_time.StageClock, collector=None) -> Rollout:
    """The step's first collection round, timed into `clock` (the feed's `CollectFn`)."""
    return _collect_timed(clock, functools.partial(collect, run, params, records, step, collector=collector), 0)


def rl_step(run: Run, state: TrainState, records, step: int, next_records=None):
    """One RL step: returns (state, metrics, rollout).

    The rollout comes from the run's feed (`jaxrl.rl.ahead`): collected now by the current policy, or (async)
    collected ahead by an older one; `next_records()` draws the next step's records for a collection the feed
    starts before this step's update (None: no next step)."""
    algo, s = run.algorithm, run.settings
    clock = step_time.StageClock()
    taken = run.feed.take(run, state, records, step, functools.partial(_collect_now, run), clock)
    ro, policy = taken.rollout, taken.policy
    collect_fn = functools.partial(collect, run, taken.behaviour, records, step)  # round -> rollout
    metrics = {**ro.metrics, **taken.metrics}
    if algo.resample is not None:
        ro, resample_metrics = algo.resample(ro, lambda k: _collect_timed(clock, collect_fn, k), s)
        metrics.update(resample_metrics)
    total_B = total_reward(ro)
    metrics["reward/mean"] = float(total_B.mean())
    metrics["frac_zero_std_groups"] = zero_std_group_frac(total_B, s.group_size, ro.segment_B,
                                                          ro.segment_sizes)
    actor_frozen = False
    for shaper in run.shapers:
        values_B, shaper_metrics = shaper(policy, ro, step_key(run.seed, step, 2))
        metrics.update(shaper_metrics)
        ro = ro.add_reward_column(values_B, shaper.name)
        actor_frozen = actor_frozen or shaper.actor_frozen(step)
    adv = segment_advantages(algo.advantages, ro.rewards_BR, ro.weights_R, ro.completion_mask_BT, s,
                             ro.segment_B, ro.segment_sizes, run.segment_estimators)
    metrics.update(adv.metrics)
    run.feed.launch(run, step + 1, next_records, functools.partial(_collect_now, run))  # async: the next rollout
    # the schedule (`jaxrl.rl.update`): one joint update, or one per role segment in turn
    state, update_metrics, group = run.schedule(run, state, policy, ro, adv, records, step, clock,
                                                frozen=actor_frozen)
    metrics.update(update_metrics)
    if "kl/loss" in metrics:  # a KL that was not measured is absent, not a flat 0
        metrics.setdefault("kl", metrics["kl/loss"])
    metrics.setdefault("entropy", metrics.get("entropy/mean", float("nan")))
    clip_key = OBJECTIVES[run.loss.objective].clip_frac_key  # the objective's clip fraction, when it has one
    if clip_key in metrics:
        metrics.setdefault("clip_frac", metrics[clip_key])
    metrics.update({f"{TIMING_PREFIX}{stage}": clock.seconds.get(stage, 0.0) for stage in step_time.STAGES})
    metrics.update(_throughput(run, ro, clock, group, run.update.ppo_epochs))
    return state, metrics, ro

