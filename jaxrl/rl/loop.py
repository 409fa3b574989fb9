"""`train(cfg, run_dir)`: setup, SFT warm start (optional), then RL steps with hooks between them.

`train` is the edge: it reads the experiment config once (through `jaxrl.rl.setup.setup` and the data, logging
and checkpoint sections) and hands explicit arguments to everything below. Hooks (metrics, sample
completions, held-out evaluation, checkpoints, preemption) run between steps; the step itself is
`jaxrl.rl.step.rl_step`.

Timing: every step's row holds the stage breakdown of `jaxrl.rl.step` plus `time/eval`, `time/checkpoint` (the
save that followed the previous row: a row is written before its own checkpoint, so that a killed run never
has a checkpoint without its row), `time/other` and `time/step` (wall time since the previous row); the
phases (warm start, evaluation, checkpoint) each log one line, and RUN/run_summary.json sums them up.

Reproducibility: every random choice is derived from (train.seed, step) with `fold_in`, and the data
iterator's position is checkpointed, so a resumed run repeats exactly the steps an uninterrupted run would
take.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl import rewards as rewards_lib
from jaxrl.io import checkpoint as ckpt_lib
from jaxrl.runtime import distributed, run_summary, step_time
from jaxrl.runtime.preemption import PreemptionGuard
from jaxrl.config import ExperimentConfig, config_dict
from jaxrl.data.pipeline import Encoder, PromptLimit, make_splits, train_iterator
from jaxrl.rl.evaluate import evaluate
from jaxrl.runtime.metrics import MetricsWriter
from jaxrl.rl import setup as setup_lib
from jaxrl.rl.run import NonFiniteError
from jaxrl.rl.step import rl_step, total_reward
from jaxrl.rl.warm_start import sft_warm_start
from jaxrl.sharding import hosts
from jaxrl.learner.train_step import TrainState

log = logging.getLogger(__name__)


def train(cfg: ExperimentConfig, run_dir: str | Path, checkpoint_dir: str | None = None,
          profile: tuple[int, int] | None = None) -> dict[str, Any]:
    """Runs (or resumes) the experiment in `run_dir`; returns the last metrics row.

    `checkpoint_dir` (default RUN/checkpoints) may be an object-store URL such as gs://bucket/run/checkpoints.
    `profile` (first, last): write a `jax.profiler` trace of those steps into RUN/profile (`step_time`).
    In a multi-host job the peers are told whether this process finished or failed (`jaxrl.runtime.distributed`),
    so a failure on one host stops the others instead of leaving them waiting in a collective.
    """
    try:
        last = _train(cfg, run_dir, checkpoint_dir, profile)
    except BaseException as e:
        distributed.finish(ok=False, message=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}")
        raise
    distributed.finish(ok=True)
    return last


def _train(cfg: ExperimentConfig, run_dir: str | Path, checkpoint_dir: str | None,
           profile: tuple[int, int] | None) -> dict[str, Any]:
    t_start = time.perf_counter()
    phases = step_time.StageClock()  # this invocation's wall time by phase (RUN/run_summary.json)
    run_dir = Path(run_dir)
    run, state, model = setup_lib.setup(cfg, run_dir)  # validates rewards first, before any model is built
    model_cfg = model.cfg
    del model  # its arrays live on in `state` (sharded copies); only the config is needed below
    d, w = cfg.data, cfg.sft_warmup
    encoder = Encoder(run.tokenizer, d.system_prompt, d.target_format, tuple(d.target_formats))
    # Prompts too long for a rollout are refused (or dropped) here, before anything compiles; an environment
    # or a multi-agent system builds its own prompts.
    limit = None if cfg.env or cfg.multi_agent else PromptLimit.of(
        context=model_cfg.max_position_embeddings, max_new_tokens=cfg.rollout.max_new_tokens,
        prompt_buckets=cfg.rollout.prompt_buckets, on_long=d.on_long_prompt)
    train_records, eval_records = make_splits(d.source, train_size=d.train_size, eval_size=d.eval_size,
                                              seed=d.seed, params=d.params, prompt_field=d.prompt_field,
                                              answer_field=d.answer_field, encoder=encoder, prompt_limit=limit)
    # a multi-agent system's questions must be over its world: refused here, before compiling
    for split, records in (("train", train_records), ("held-out", eval_records)):
        run.collector.check_records(records, split)
    # Each host reads and encodes its block of every global batch (the same global order on every host); the
    # step's prompt records are then exchanged (`hosts.gather_json`, a few KB), so N hosts take exactly the
    # steps of one host with all the devices. Tokens and completions stay on the hosts that own their rows.
    data_it = train_iterator(train_records, encoder, batch_size=d.prompts_per_step, seed=d.seed,
                             process_index=jax.process_index(), process_count=jax.process_count())
    warm_start = functools.partial(sft_warm_start, run, records=train_records, encoder=encoder, steps=w.steps,
                                   lr=w.lr, batch_size=w.batch_size, packed=w.packing)
    k = cfg.train.eval_samples
    sampled = setup_lib.sampling_spec(cfg, eval_samples=k) if k > 1 else None
    # held-out rows (a multi-agent system: the rows it evaluates, e.g. MARCH's Solver answers)
    collect = lambda params, records, spec, seed: run.collector(params, records, spec, seed, train=False)
    # The trained parameters (LoRA: the adapters) -> the policy the sampler runs (LoRA: base + adapters).
    eval_batch = cfg.train.eval_batch_size or d.prompts_per_step
    evaluate_fn = lambda params: evaluate(collect, run.policy.sampling_params(params), eval_records, encoder,
                                          run.eval_sampling, batch_size=eval_batch, sampled=sampled, seed=run.seed)

    def evaluate_now(params, step: int) -> tuple[dict[str, float], float]:
        """(the eval metrics, seconds), with one log line."""
        run.feed.settle()  # async: the next rollout's collection (same collector and rewards) has finished
        t0 = time.perf_counter()
        with phases("eval"):
            out = evaluate_fn(params)
        seconds = time.perf_counter() - t0
        log.info("evaluation at step %d: held-out accuracy %.4g on %d prompts (%.1f s)", step,
                 out.get("eval/accuracy", float("nan")), len(eval_records), seconds)
        return out, seconds

    ckpt = ckpt_lib.Checkpointer(checkpoint_dir or run_dir / "checkpoints", every=cfg.checkpoint.every,
                                 keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save)
    start, nonfinite_run = 0, 0
    initial = state
    # stages whose host-side state goes into checkpoints (`extra["stages"][name]`): CLIPO's head, the
    # collector's (SSP's pool, under "ssp" as before the collector plug-in; the others carry none)
    stateful = [*run.shapers, run.collector]
    restored = ckpt.restore_latest(state.params, state.opt_state) if cfg.checkpoint.resume else None
    if restored is not None:
        start = restored.step
        run.policy.check_restore(restored.extra, ckpt.directory)
        state = TrainState(restored.params, restored.opt_state, jnp.asarray(start, jnp.int32))
        data_it.set_state(restored.extra["data_state"])
        run.feed.restore(ckpt, restored, state.params)  # async: the sampler's versions, the launched rollout
        nonfinite_run = int(restored.extra.get("nonfinite_run", 0))
        for shaper in stateful:
            saved = restored.extra.get("stages", {}).get(shaper.name)
            if saved is not None:
                shaper.load_state(saved)
            elif shaper.state_json() is not None:
                log.warning("checkpoint has no state of stage %r; it restarts from its initialisation",
                            shaper.name)
        if run.policy.reference_follows_warm_start and w.steps > 0:
            # The reference policy is the warm-started model: step 0's parameters, saved after the warm start
            # (a run saved before step 0 was kept replays the deterministic warm start to rebuild it exactly).
            with phases("warm_start"):
                warm = (ckpt.restore_params(ckpt_lib.WARM_START_STEP, initial.params)
                        if ckpt_lib.WARM_START_STEP in ckpt.steps() else warm_start(initial)[0].params)
                run.policy.set_reference(warm)
        log.info("resumed from step %d in %s", start, ckpt.directory)
    elif w.steps > 0:
        with phases("warm_start"):
            state, curve = run.policy.warm_start(state, warm_start)
        log.info("SFT warm start: NLL %.3f -> %.3f over %d steps (%.1f s)", curve[0], curve[-1], len(curve),
                 phases.seconds["warm_start"])
        if run.policy.reference_follows_warm_start:  # KL to the policy RL starts from (LoRA: the base)
            run.policy.set_reference(jax.tree.map(jnp.copy, state.params))
    if restored is None:  # the schedule's own state (PPO's critic) starts from the model RL starts from
        run.schedule.begin(run.policy.sampling_params(state.params))
    else:
        run.schedule.load(ckpt.restore_items(start, run.schedule.arrays()))
    del initial
    # Only now, with the checkpoint restored (or none to restore), does the run directory change: a resume
    # that fails leaves config.yaml and model_config.json as they were.
    setup_lib.write_resolved_config(cfg, run_dir)
    setup_lib.save_model_config(ckpt, model_cfg, run.tokenizer)
    last: dict[str, Any] = {"step": start}  # no step to take (train.steps reached): the step it stands at
    reward_failures = rewards_lib.RewardFailureTracker(cfg.train.max_failed_reward_steps)

    def extra() -> dict[str, Any]:
        # the collector's state before a collection the async feed launched ahead (resume collects it again)
        states = {sh.name: run.feed.collector_state(sh) if sh is run.collector else sh.state_json()
                  for sh in stateful}
        return {"data_state": data_it.get_state(), "nonfinite_run": nonfinite_run,
                "rng": ckpt_lib.key_to_json(jax.random.key(cfg.train.seed)),
                "stages": {k: v for k, v in states.items() if v is not None}, **run.policy.checkpoint_extra()}

    def save(step: int) -> float:
        t0 = time.perf_counter()
        with phases("checkpoint"):
            behind, feed_extra = run.feed.checkpoint(step)
            ckpt.save(step, state.params, state.opt_state, {**extra(), **feed_extra}, behind=behind,
                      items=run.schedule.arrays())
            # export-ready adapters (LoRA): export-hf --checkpoint RUN/adapters
            run.policy.export(state.params, run_dir / "adapters")
        seconds = time.perf_counter() - t0
        log.info("checkpoint: step %d saved in %s (%.1f s%s)", step, ckpt.directory, seconds,
                 "; finishing in the background" if cfg.checkpoint.async_save else "")
        return seconds

    # A bar only on a terminal (a log file gets plain lines every `logging.every` steps, never bar frames);
    # the trackers of `logging.trackers` on process 0 only (`MetricsWriter.from_config`).
    profiler = step_time.StepProfiler(profile, run_dir / "profile")
    stage_sums: collections.Counter = collections.Counter()
    with MetricsWriter.from_config(run_dir, cfg.logging, resume_step=start, total_steps=cfg.train.steps,
                                   config=config_dict(cfg)) as writer, \
            PreemptionGuard() as guard:
        if restored is None and cfg.train.eval_every:
            writer.write(0, evaluate_now(state.params, 0)[0])
        if restored is None and w.steps > 0:  # the warm-started state, kept (`Checkpointer`), after its eval row
            checkpoint_s = save(ckpt_lib.WARM_START_STEP)
        else:
            checkpoint_s = 0.0  # the save after the previous row
        t_loop = t_row = time.perf_counter()
        draw = lambda: hosts.gather_json(next(data_it))  # noqa: E731 -- the next global batch's records
        for step in range(start + 1, cfg.train.steps + 1):
            with profiler.step(step):
                records = run.feed.records_for(step, draw)  # async: drawn when its collection was launched
                state, metrics, ro = rl_step(run, state, records, step,
                                             next_records=draw if step < cfg.train.steps else None)
                reward_failures.update(*ro.score_infos)  # a reward failing on every sample stops the run
                nonfinite_run = nonfinite_run + 1 if metrics.get("train/nonfinite", 0) else 0
                metrics["train/nonfinite_run"] = float(nonfinite_run)
                metrics["time/eval"] = 0.0
                if cfg.train.eval_every and step % cfg.train.eval_every == 0:
                    evaluated, metrics["time/eval"] = evaluate_now(state.params, step)
                    metrics.update(evaluated)
            metrics["time/checkpoint"], now = checkpoint_s, time.perf_counter()
            metrics["time/step"], t_row = now - t_row, now
            timed = sum(metrics[f"time/{k}"] for k in (*step_time.STAGES, "eval", "checkpoint"))
            metrics["time/other"] = max(metrics["time/step"] - timed, 0.0)
            stage_sums.update({k[len("time/"):]: v for k, v in metrics.items() if k.startswith("time/")})
            writer.write(step, metrics)
            if step % cfg.logging.sample_every == 0 and cfg.logging.num_samples:
                k = cfg.logging.num_samples
                writer.write_samples(step, [r["prompt"] for r in ro.records[:k]], ro.completions[:k],
                                     list(total_reward(ro)[:k]))
            last = {"step": step, **metrics}
            stop = guard.should_stop()
            too_many = nonfinite_run >= cfg.optimizer.max_nonfinite_steps
            checkpoint_s = 0.0
            if ckpt.should_save(step) or stop or too_many or step == cfg.train.steps:
                checkpoint_s = save(step)
            profile_s = profiler.after(step)
            if profile_s is not None:
                t_row += profile_s  # writing the trace is not the next step's time
                log.info("profile of steps %d-%d written to %s (%.1f s)", *profile, profiler.out_dir, profile_s)
            if too_many:
                ckpt.close()
                raise NonFiniteError(
                    f"{nonfinite_run} consecutive steps had a non-finite loss or gradient (limit "
                    f"optimizer.max_nonfinite_steps={cfg.optimizer.max_nonfinite_steps}); stopped at step "
                    f"{step} with a checkpoint in {ckpt.directory}")
            if stop:
                log.warning("stopping after step %d (preemption); checkpoint saved", step)
                last["stopped_by_signal"] = guard.signal
                break
        profiler.close()
    run.feed.close()  # a collection launched before a stop by signal finishes (its rollout is not used)
    with phases("checkpoint"):
        ckpt.close()  # waits for an asynchronous save
    if jax.process_index() == 0:
        _write_summary(cfg, run_dir, ckpt, start, last, phases, stage_sums, t_start, t_loop)
    return last


def _write_summary(cfg: ExperimentConfig, run_dir: Path, ckpt: ckpt_lib.Checkpointer, start: int,
                   last: dict[str, Any], phases: step_time.StageClock, stage_sums: dict[str, float],
                   t_start: float, t_loop: float) -> None:
    """RUN/run_summary.json (`jaxrl.runtime.run_summary`) of this invocation."""
    wall = dict(phases.seconds)
    stages = dict(stage_sums)
    eval_before_loop = wall.get("eval", 0.0) - stages.get("eval", 0.0)
    wall.update(total=time.perf_counter() - t_start, rl_steps=stages.pop("step", 0.0),
                setup=max(t_loop - t_start - wall.get("warm_start", 0.0) - eval_before_loop, 0.0))
    directory = str(ckpt.directory)
    run_summary.write(run_dir, {
        "steps": {"first": start + 1, "last": int(last.get("step", start)), "total": cfg.train.steps},
        "stopped_by_signal": last.get("stopped_by_signal"),
        "wall_s": wall,
        "step_stages_s": stages,
        "held_out_accuracy": run_summary.held_out(run_dir),
        "checkpoint": {"directory": directory, "step": int(last.get("step", start))},
        "export_hf": run_summary.export_command(directory if "://" in directory else str(run_dir), run_dir,
                                                lora=cfg.model.lora is not None),
        "file": str(run_dir / run_summary.SUMMARY_FILE),
    })
