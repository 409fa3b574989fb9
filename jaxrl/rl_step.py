"""One RL step as a straight line of stages, each a call (the `Run` holds everything they need):

    collect -> resample (DAPO) -> shape rewards (CLIPO bonus, KL in reward) -> advantages
            -> assemble (+ extra rows: SFT-aux) -> update

Which optional stages run is the algorithm record's business (`jaxrl.algorithms`); this function never names
an algorithm.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxrl import rollout as rollout_lib, trainer
from jaxrl.algorithms import combined_reward, segment_advantages, zero_std_group_frac
from jaxrl.train_step import TrainState

TIMING_PREFIX = "timing/"


def step_key(seed: int, step: int, stream: int) -> jax.Array:
    """The PRNG key of one random stream of one step: every random choice of a run derives from (seed, step)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), stream)


def total_reward(ro: rollout_lib.Rollout) -> np.ndarray:
    """The weighted sum of a rollout's rewards per sample, with skipped (NaN) rewards counted as 0."""
    return combined_reward(np.nan_to_num(ro.rewards_NK), ro.weights_K)


def collect(run: trainer.Run, params, records, step: int, round_: int = 0) -> rollout_lib.Rollout:
    """Stage 1: G completions (or multi-turn episodes) per prompt, decoded and scored (round > 0: a
    resampling round's fresh seed)."""
    stream = 0 if round_ == 0 else 100 + round_
    return trainer.collect(run, params, records, run.sampling, step_key(run.seed, step, stream))


def rl_step(run: trainer.Run, state: TrainState, records, step: int):
    """One RL step: returns (state, metrics, rollout)."""
    algo, s = run.algorithm, run.settings
    t0 = time.perf_counter()
    policy = run.policy(state.params)  # the full parameters (LoRA: base + adapters, merged once per step)
    ro = collect(run, policy, records, step)
    metrics = dict(ro.metrics)
    if algo.resample is not None:
        ro, resample_metrics = algo.resample(ro, lambda k: collect(run, policy, records, step, k), s)
        metrics.update(resample_metrics)
    total_N = total_reward(ro)
    metrics["reward/mean"] = float(total_N.mean())
    metrics["frac_zero_std_groups"] = zero_std_group_frac(total_N, s.group_size, ro.segment_N,
                                                          ro.segment_sizes)
    t1 = time.perf_counter()
    actor_frozen = False
    for shaper in run.shapers:
        values_N, shaper_metrics = shaper(policy, ro, step_key(run.seed, step, 2))
        metrics.update(shaper_metrics)
        ro = ro.add_reward_column(values_N, shaper.name)
        actor_frozen = actor_frozen or shaper.actor_frozen(step)
    adv = segment_advantages(algo.advantages, ro.rewards_NK, ro.weights_K, ro.completion_mask_BT, s,
                             ro.segment_N, ro.segment_sizes, run.segment_estimators)
    metrics.update(adv.metrics)
    phases = getattr(run.multi_agent, "update_phases", ())
    if run.role_adapters and not phases and ro.segment_N is not None:  # per-role adapters: a phase per role
        phases = tuple(int(x) for x in np.unique(ro.segment_N))
    if phases and ro.segment_N is not None and not actor_frozen:  # a sequential multi-agent schedule
        t2 = time.perf_counter()
        state, update_metrics = phased_update(run, state, policy, ro, adv, step, phases)
        del policy
        metrics.update(update_metrics)
    else:
        extra = None
        if algo.extra_rows is not None:
            extra = algo.extra_rows(records, run.tokenizer, ro.prompt_width, ro.completion_mask_BT.shape[1])
        # a multi-agent rollout has the trained roles' rows, not prompts x G: pad them to the batch shards x
        # mini-batches with rows that train on nothing (as a sequential update's phases are)
        batch, mismatch_metrics = trainer.assemble(run, policy, ro, adv, extra_rows=extra,
                                                   pad=ro.segment_N is not None)
        del policy  # LoRA: the merged policy is not held during the update
        metrics.update(mismatch_metrics)
        t2 = time.perf_counter()
        if not actor_frozen:
            state, update_metrics = trainer.update(run, state, batch, step)
            metrics.update(update_metrics)
    t3 = time.perf_counter()
    tokens = float(np.sum(ro.mask_BL))
    if "kl/loss" in metrics:  # a KL that was not measured is absent, not a flat 0
        metrics.setdefault("kl", metrics["kl/loss"])
    metrics.setdefault("entropy", metrics.get("entropy/mean", float("nan")))
    for key in ("pg/clip_frac", "cispo/clip_frac"):  # the objective's clip fraction, when it has one
        if key in metrics:
            metrics.setdefault("clip_frac", metrics[key])
            break
    metrics.update({f"{TIMING_PREFIX}rollout_s": t1 - t0, f"{TIMING_PREFIX}logprob_s": t2 - t1,
                    f"{TIMING_PREFIX}update_s": t3 - t2, "tokens_per_s": tokens / max(t3 - t0, 1e-9)})
    return state, metrics, ro


def phased_update(run: trainer.Run, state: TrainState, policy, ro: rollout_lib.Rollout, adv, step: int,
                  phases: tuple[int, ...]) -> tuple[TrainState, dict[str, float]]:
    """The sequential schedule of a multi-agent update (spec/multi-agent.md §3.8; SSP updates its Proposer,
    then its Solver): one assemble + update per role segment, in `phases` order. A later phase takes its old
    log-probs at the policy the previous phase left (the reference's "per_phase" timing), so its PPO ratios
    start at 1. Metrics: `role/<name>/<key>` per phase (update and mismatch); the plain update keys are the
    phases' mean (the non-finite flag: their max), the plain mismatch keys the first phase's (sampler vs
    trainer before any update). Each phase is one optimiser step per mini-batch and epoch.

    With per-role adapters (`run.role_adapters`) a phase updates its role's adapters only, from that role's
    policy; no other role's weights change, so a later phase keeps its sampler's old log-probs."""
    from jaxrl.multi_agent.adapters import role_params

    names = {int(r["role_id"]): str(r["role"]) for r in ro.records}
    out: dict[str, float] = {}
    done: list[dict[str, float]] = []
    for seg in phases:
        rows = np.flatnonzero(ro.segment_N == seg)
        if not rows.size:
            continue
        if done:
            policy = run.policy(state.params)
        sub = adv._replace(adv_NT=adv.adv_NT[rows], clip_low_N=adv.clip_low_N[rows],
                           clip_high_N=adv.clip_high_N[rows])
        role = names[seg]
        batch, mismatch = trainer.assemble(run, role_params(policy, role), rollout_lib.take_rows(ro, rows), sub,
                                           recompute_old=bool(done) and not run.role_adapters, pad=True)
        state, update = trainer.update(run, state, batch, step, role=role if run.role_adapters else None)
        if not done:
            out.update(mismatch)
        out.update({f"role/{role}/{k}": v for k, v in {**mismatch, **update}.items()})
        done.append(update)
    for key in done[0] if done else ():
        values = [d[key] for d in done]
        out[key] = float(max(values)) if key == "train/nonfinite" else float(np.mean(values))
    return state, out
