"""Setup: the experiment config is read once, here, into a `Run` of resolved specs (`jaxrl.rl.run`).

    run, state = setup(cfg, run_dir)          # the only function below the CLI that reads ExperimentConfig
    ro    = run.collector(params, records)     # completions, episodes or roles' rows    (jaxrl.rl.collect)
    ro    = resample / shape(ro)               # the algorithm record's optional stages  (jaxrl.algorithms)
    adv   = run.algorithm.advantages(...)      # per-token advantages, clip bounds
    batch = assemble(run, params, ro, adv)     # completion-space TrainBatch, old / reference log-probs
    state = update(run, state, batch, step)    # jitted, donated; PPO epochs x mini-batches (jaxrl.rl.batch)

Setup picks one implementation of each plug-in (`Policy`, `Collector`, `UpdateSchedule`); the step
(`jaxrl.rl.step`) never asks which one it got. Everything below `setup` takes the `Run` (and plain arrays).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl import rewards as rewards_lib
from jaxrl.io import build
from jaxrl.io import checkpoint as ckpt_lib, model_io
from jaxrl.runtime import step_time
from jaxrl.algorithms import ALGORITHMS, Algorithm, AlgoSettings, KLRewardPenalty
from jaxrl.config import DistillMode, ExperimentConfig, KLWhere, dump_config
from jaxrl.config.algorithm import algorithm_params, record_params
from jaxrl.errors import ConfigError, UserError
from jaxrl.models import lora
from jaxrl.learner.objectives import OBJECTIVES, PARAMS_KEY, objective_kwargs
from jaxrl.learner.optim import build_optimizer
from jaxrl.rl import packing, placement, unpadding
from jaxrl.rl.partial import make_feed
from jaxrl.rl.batch import row_multiple, assemble, update
from jaxrl.rl.collect import Collector, EnvEpisodes, SingleTurn, System, SystemRows
from jaxrl.rl.policy import Dense, LoRA, PerRoleAdapters, Policy
from jaxrl.rl.run import MismatchSpec, Run, UpdateSpec, placed_shardings
from jaxrl.rl.update import Joint, Phased, Stages, UpdateSchedule
from jaxrl.sampling import SamplingSpec
from jaxrl.sharding import RULES, hosts, make_constrain, make_mesh, row_sharding, state_shardings
from jaxrl.learner.train_step import (LossSpec, TrainState, jitted_logprob_pass, jitted_packed_logprob_pass,
                                      jitted_train_step)

# Reward types that shape by length; DAPO's keep filter and CLIPO's correctness read the other columns.
LENGTH_SHAPING_TYPES = ("length", "overlong")
log = logging.getLogger(__name__)


def _pure(state) -> dict:
    """An `nnx.State` (the model's parameters, or their shardings) as a plain nested dict."""
    return state.to_pure_dict()


def sampling_spec(cfg: ExperimentConfig, *, greedy: bool = False, eval_samples: int | None = None) -> SamplingSpec:
    """The rollout's `SamplingSpec`; greedy: one sample per prompt at τ = 0, and `eval_samples` k: k samples at
    the rollout's temperature, both for held-out evaluation, which decodes with the static engine (its
    batches, the last one short, are not the step's rows that `rollout.engine.slots` is sized for)."""
    r = cfg.rollout
    buckets = lambda b: tuple(b) or None
    if greedy:
        return SamplingSpec(max_new_tokens=r.max_new_tokens, num_samples=1, temperature=0.0,
                            prompt_buckets=buckets(r.prompt_buckets), gen_buckets=buckets(r.gen_buckets))
    engine = dict(engine="static") if eval_samples else dict(engine=r.engine.kind, slots=r.engine.slots)
    return SamplingSpec(max_new_tokens=r.max_new_tokens, num_samples=eval_samples or r.group_size,
                        temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                        prompt_buckets=buckets(r.prompt_buckets), gen_buckets=buckets(r.gen_buckets), **engine)


def algo_settings(cfg: ExperimentConfig) -> AlgoSettings:
    """The algorithm's settings: the shared ones, its own parameters (`algorithm.params` as its record's
    class) and the task reward columns (every reward but length shaping, unless its parameters choose)."""
    a = cfg.algorithm
    record = ALGORITHMS[a.name]  # registered at config load
    params = algorithm_params(record.params, a.params, record.name)
    task = tuple(k for k, r in enumerate(cfg.rewards) if r.type not in LENGTH_SHAPING_TYPES)
    if record.task_columns is not None:
        task = record.task_columns(params, tuple(r.name for r in cfg.rewards)) or task
    return AlgoSettings(group_size=cfg.rollout.group_size, eps=a.adv_eps, clip_low=a.clip.low,
                        clip_high=a.clip.high, section=a, task_columns=task, params=params)


def loss_spec(cfg: ExperimentConfig, algorithm: Algorithm, settings: AlgoSettings) -> LossSpec:
    a = cfg.algorithm
    o = a.objective
    objective = OBJECTIVES[o.name]  # registered at config load
    kwargs = objective_kwargs(record_params(objective.params, o.params, objective.name, PARAMS_KEY))
    distill = a.distill.teacher is not None and a.distill.mode is DistillMode.REVERSE_KL_LOSS
    spec = LossSpec(agg=a.agg_mode, dual_clip=a.clip.dual,
                    kl_beta=a.kl.beta if a.kl.where is KLWhere.LOSS else 0.0, kl_kind=a.kl.kind,
                    entropy_coef=a.entropy_coef, grad_accum=a.grad_accum, objective=o.name,
                    objective_kwargs=kwargs,
                    # the sampler's old log-probs are the tempered policy's (`filters.sampled_logprobs`)
                    temperature=cfg.rollout.temperature or 1.0,
                    distill_coef=a.distill.coef if distill else 0.0, distill_kind=a.distill.kind)
    return dataclasses.replace(spec, **algorithm.loss(settings))


def _check_whole_groups_per_host(cfg: ExperimentConfig, processes: int) -> None:
    """A pairwise judge scores the G completions of one prompt on the host that owns them, so each host must
    own whole groups: rows are split over hosts in contiguous blocks of P·G / processes rows
    (tpu/README.md)."""
    pairwise = [r.name for r in cfg.rewards if r.type == "pairwise"]
    if pairwise and cfg.data.prompts_per_step % processes:
        raise ConfigError(f"data.prompts_per_step={cfg.data.prompts_per_step}: must be divisible by the "
                          f"{processes} processes with the pairwise reward {pairwise[0]!r} (the "
                          "completions of one prompt must sit on one host)")


def setup(cfg: ExperimentConfig, run_dir: Path) -> tuple[Run, TrainState, Any]:
    """Builds mesh, model, tokenizer, rewards, optimiser and jitted functions; returns (run, state, model)."""
    rewards = rewards_lib.resolve(cfg.rewards)  # validated before any model is built
    _check_whole_groups_per_host(cfg, jax.process_count())
    algorithm = ALGORITHMS[cfg.algorithm.name]
    settings = algo_settings(cfg)
    mesh, sampler_mesh = _meshes(cfg.mesh)  # sampler_mesh: None when the sampler shares the training devices
    placement.check_slots(cfg.rollout.engine.slots, sampler_mesh or mesh)
    rules = RULES[cfg.mesh.rules]
    tokenizer = build.build_tokenizer(cfg.model, cfg.tokenizer)
    system = _multi_agent_system(cfg, tokenizer, algorithm)  # invalid params fail before the model is built
    batch_stages = _batch_stages(cfg, tokenizer, mesh, rules)  # a distillation teacher: loaded and checked
    model = build.build_model(cfg.model, vocab_size=len(tokenizer), seed=cfg.train.seed,
                              constrain=make_constrain(mesh, rules))
    graphdef, params_state = nnx.split(model)
    tx = build_optimizer(cfg.optimizer, cfg.train.steps)
    param_sharding = state_shardings(params_state, mesh, rules)
    # every process holds the whole model (a checkpoint restored onto its first device): placed on the mesh
    params = hosts.place_global(_pure(params_state), _pure(param_sharding))
    spec = loss_spec(cfg, algorithm, settings)
    lora_cfg, base = cfg.model.lora, None
    if lora_cfg is not None:  # train adapters only; the frozen base is the KL reference (no second copy)
        base, params, train_sharding, base_sha = _lora_setup(cfg, params, mesh, rules)
        spec = dataclasses.replace(spec, lora=lora_cfg)
    else:
        train_sharding = _pure(param_sharding)
    opt_state = tx.init(params)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    if lora_cfg is None:
        opt_sharding = state_shardings(opt_state, mesh, rules, params=params_state)
    else:  # moments mirror their adapter's sharding; scalars (Adam's count) are replicated
        opt_sharding = placed_shardings(opt_state, mesh)
    state_sharding = TrainState(params=train_sharding, opt_state=opt_sharding, step=rep)
    state = hosts.place_global(TrainState(params=params, opt_state=opt_state, step=jnp.zeros((), jnp.int32)),
                               state_sharding)
    jitted = jitted_train_step(graphdef, spec, tx, state_sharding)
    step_fn = lambda state, batch: jitted(state, batch, base)
    jitted_logprobs = jitted_logprob_pass(graphdef, spec)

    jitted_packed = jitted_packed_logprob_pass(graphdef, spec)

    def logprob_fn(params, tokens_BL, mask_BL, width, group=1, packed=None):
        if packed is not None:  # the same log-probs from packed rows (`train.packing: auto`)
            return jitted_packed(params, packed)
        return jitted_logprobs(params, tokens_BL, mask_BL, width, group)
    # beta = 0 keeps no reference model in memory; under LoRA the reference is the base itself.
    kl = cfg.algorithm.kl.beta > 0
    if lora_cfg is not None:
        policy: Policy = LoRA(base, lora_cfg, base_sha, str(cfg.model.hf_path or cfg.model.checkpoint or ""),
                              kl=kl)
    else:
        policy = Dense(jax.tree.map(jnp.copy, params) if kl else None)
    if system is not None and cfg.multi_agent.adapters == "per_role":  # one adapter set per role
        from jaxrl.multi_agent import adapters as role_adapters

        state = role_adapters.per_role_state(state, system.adapter_roles)
        policy = PerRoleAdapters(policy, tuple(system.adapter_roles), system.adapter_aliases)
    sampler_graphdef = graphdef
    if sampler_mesh is not None:  # the sampler's programs constrain activations on its own mesh
        sampler_graphdef = nnx.split(type(model).abstract(model.cfg,
                                                          constrain=make_constrain(sampler_mesh, rules)))[0]
    collector = _collector(cfg, system, sampler_graphdef, tokenizer, rewards, sampler_mesh or mesh, rules)
    if sampler_mesh is not None:  # weights move to the sampler's devices, rollouts back to the trainer's
        if isinstance(policy, PerRoleAdapters):
            raise ConfigError("mesh.rollout_devices with multi_agent.adapters='per_role': not supported yet "
                              "(use adapters: shared, or mesh.rollout_devices: 0)")
        collector = placement.SamplerDevices(collector, sampler_mesh, mesh)
    m = cfg.algorithm.mismatch
    run = Run(run_dir=run_dir, mesh=mesh, rules=rules, graphdef=graphdef, hidden_dim=model.cfg.hidden_size,
              tokenizer=tokenizer, tx=tx, loss=spec,
              update=UpdateSpec(cfg.algorithm.ppo_epochs, cfg.algorithm.mini_batches, cfg.train.seed),
              sampling=sampling_spec(cfg), eval_sampling=sampling_spec(cfg, greedy=True), rewards=rewards,
              algorithm=algorithm, settings=settings, seed=cfg.train.seed,
              logprobs_from_sampler=cfg.rollout.logprobs_from_sampler,
              mismatch=MismatchSpec.from_config(m), state_sharding=state_sharding,
              step_fn=step_fn, logprob_fn=logprob_fn,
              collector=collector, policy=policy,
              schedule=_schedule(cfg, system, policy, model, tokenizer, mesh, rules),
              segment_estimators=_segment_estimators(cfg, system),
              share_prompts=cfg.train.share_prompts,
              packer=packing.packer_for(cfg.train.packing, mesh, rules, spec.grad_accum,
                                        attention_weight=unpadding.attention_weight_of(model.cfg)),
              flops_per_token=functools.partial(step_time.train_flops_per_token, model.cfg,
                                                lora=lora_cfg is not None), batch_stages=batch_stages,
              feed=make_feed(cfg.train.async_.max_staleness, processes=jax.process_count(), devices=mesh.devices.size,
                             own_sampler_devices=sampler_mesh is not None, partial=cfg.train.async_.partial_rollouts))
    if cfg.train.share_prompts == "always":
        _check_always_shared(cfg, run, algorithm)
    if algorithm.shaper is not None:
        run.shapers.append(algorithm.shaper(run, settings))
    if cfg.algorithm.kl.beta > 0 and cfg.algorithm.kl.where is KLWhere.REWARD:
        penalty = KLRewardPenalty(run, cfg.algorithm.kl.beta, cfg.algorithm.kl.kind)
        if algorithm.critic:  # per token, where the critic's GAE reads it
            run.schedule.token_rewards = (penalty.token_rewards,)
        else:  # one reward column: the row's summed penalty
            run.shapers.append(penalty)
    return run, state, model


def _meshes(mesh_cfg):
    """(the training mesh, the sampler's mesh or None): `mesh.rollout_devices` sets the first devices of each
    host apart for the sampler (`jaxrl.rl.placement`)."""
    if not mesh_cfg.rollout_devices:
        return make_mesh(mesh_cfg), None
    sampler, trainer = placement.split_devices(jax.devices(), mesh_cfg.rollout_devices)  # N / P on each host
    log.info("mesh.rollout_devices=%d: the sampler on devices %s, the trainer on devices %s",
             mesh_cfg.rollout_devices, [d.id for d in sampler], [d.id for d in trainer])
    return make_mesh(mesh_cfg, trainer), placement.rollout_mesh(mesh_cfg, sampler)


def _batch_stages(cfg: ExperimentConfig, tokenizer, mesh, rules) -> list:
    """The stages on each assembled batch: on-policy distillation's teacher (`algorithm.distill.teacher`)."""
    d = cfg.algorithm.distill
    if d.teacher is None:
        return []
    from jaxrl.rl.distill import load_teacher

    return [load_teacher(d.teacher, tokenizer, mesh, rules, mode=d.mode.value, coef=d.coef,
                         discount=d.discount)]


def _schedule(cfg: ExperimentConfig, system, policy: Policy, model, tokenizer, mesh, rules) -> UpdateSchedule:
    """A multi-agent system's sequential order (SSP: Proposer, then Solver), else one phase per role with
    per-role adapters (each role's adapters in turn, keeping the sampler's old log-probs), else joint; around
    it, for an algorithm with a critic (PPO), the critic's values, GAE and update (`jaxrl.rl.critic`)."""
    stages = Stages(assemble, update)
    order = system.update_phases if system is not None else ()
    if order:
        inner: UpdateSchedule = Phased(stages, tuple(order), recompute_old=not policy.roles)
    elif policy.roles:
        inner = Phased(stages, None, recompute_old=False)
    else:
        inner = Joint(stages)
    if not ALGORITHMS[cfg.algorithm.name].critic:
        return inner
    from jaxrl.rl import critic as critic_lib

    p, a = cfg.algorithm.ppo, cfg.algorithm
    spec = critic_lib.CriticSpec(gamma=p.gamma, lam=p.lam, value_clip=p.value_clip, whiten=p.whiten,
                                 warmup_steps=p.critic_warmup_steps, agg=a.agg_mode, grad_accum=a.grad_accum,
                                 lora=cfg.model.lora if p.critic_lora else None)
    tx = build_optimizer(dataclasses.replace(cfg.optimizer, lr=p.critic_lr or cfg.optimizer.lr), cfg.train.steps)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    critic = critic_lib.make_critic(_pure(nnx.state(model, nnx.Param)), model.cfg, pad, p.critic_init, mesh,
                                    rules, tx, spec, seed=cfg.train.seed + 5, base=policy.frozen)
    return critic_lib.ActorCritic(inner, critic)


def _segment_estimators(cfg: ExperimentConfig, system: System | None) -> tuple:
    """Per role segment (segment id = the role's index in the system's roles): the advantage estimator of
    `multi_agent.estimators`, None = the algorithm's; () without any."""
    own = cfg.multi_agent.estimators if system is not None else {}
    if not own:
        return ()
    return tuple(_own_estimator(ALGORITHMS[own[role]]) if role in own else None for role in system.adapter_roles)


def _own_estimator(record: Algorithm):
    """A role's estimator (`multi_agent.estimators`) runs with its record's default parameters
    (`algorithm.params` are the run algorithm's)."""
    params = algorithm_params(record.params, {}, record.name)
    return lambda rewards_BR, weights_R, mask_BT, s: record.advantages(
        rewards_BR, weights_R, mask_BT, dataclasses.replace(s, params=params))


def eval_collector(cfg: ExperimentConfig, graphdef, tokenizer, rewards: rewards_lib.Rewards) -> Collector:
    """The collector a run of `cfg` evaluates with, around a loaded model (`jaxrl eval`): single-turn
    completions, the run's environment episodes or its multi-agent system's held-out rows, built exactly as
    `setup` builds the run's, so a checkpoint's scores are its training-time `eval/*` numbers."""
    if cfg.multi_agent is not None and cfg.multi_agent.adapters == "per_role":
        raise UserError("multi_agent.adapters='per_role': jaxrl eval runs one policy, and this run has one "
                        "adapter set per role; its training-time eval/* rows are in RUN/metrics.jsonl")
    system = _multi_agent_system(cfg, tokenizer, ALGORITHMS[cfg.algorithm.name])
    return _collector(cfg, system, graphdef, tokenizer, rewards, make_mesh(cfg.mesh), RULES[cfg.mesh.rules])


def _multi_agent_system(cfg: ExperimentConfig, tokenizer, algorithm: Algorithm):
    """The configured multi-agent system (None without one): invalid params, or role group sizes the
    algorithm cannot handle, are config errors."""
    if cfg.multi_agent is None:
        return None
    from jaxrl.multi_agent import make_system

    system = make_system(cfg.multi_agent.system, cfg.multi_agent.params, tokenizer)
    sizes = system.group_sizes(cfg.rollout.group_size)
    for role in cfg.multi_agent.estimators:
        if role not in sizes:
            raise ConfigError(f"multi_agent.estimators.{role}: not a trained role of {cfg.multi_agent.system} "
                              f"(trained roles: {', '.join(sizes)})")
    _check_role_groups(sizes, algorithm, cfg.multi_agent.system,
                       sequential=bool(system.update_phases),
                       estimators={r: ALGORITHMS[n] for r, n in cfg.multi_agent.estimators.items()})
    if cfg.multi_agent.adapters == "per_role":  # each role's rows update its own adapters, one role at a time
        kl = cfg.algorithm.kl
        stage = ("extra rows" if algorithm.extra_rows is not None else "reward shaping"
                 if algorithm.shaper is not None or (kl.beta > 0 and kl.where is KLWhere.REWARD) else "")
        if stage:
            raise ConfigError(f"multi_agent.adapters='per_role' with algorithm.name={algorithm.name!r}: its "
                              f"{stage} (SFT-aux rows, CLIPO's head, KL in the reward) work on one policy; use "
                              "adapters: shared, or a GRPO-family algorithm with kl.where: loss")
    return system


def _collector(cfg: ExperimentConfig, system: System | None, graphdef, tokenizer,
               rewards: rewards_lib.Rewards, mesh, rules) -> Collector:
    """The run's collector: the multi-agent system's, the environment's (invalid params fail here, before
    any step), or single-turn completions."""
    if system is not None:
        return SystemRows(system, graphdef, tokenizer, rewards, sampling_spec(cfg))
    if cfg.env is not None:
        from jaxrl.envs import EpisodeBudget, make_env

        e = cfg.env
        env_factory = make_env(e.name, e.params, tokenizer)
        budget = EpisodeBudget(max_turns=e.max_turns, max_total_tokens=e.max_total_tokens, cache=e.cache,
                               on_error=e.on_error, step_timeout_s=e.step_timeout_s)
        return EnvEpisodes(graphdef, tokenizer, rewards, env_factory, budget,
                           functools.partial(row_sharding, mesh, rules))
    return SingleTurn(graphdef, tokenizer, rewards)


def _check_role_groups(sizes: dict[str, int], algorithm: Algorithm, system: str, *,
                       sequential: bool = False, estimators: dict[str, Algorithm] | None = None) -> None:
    """The algorithm (or the role's own, `estimators`) must define advantages for every role's group size,
    its group-wise stages (DAPO's resampling, CLIPO's contrastive head) assume one group size for all rows,
    and its extra rows (SFT-aux) need one joint update (not a `sequential` role-by-role one)."""
    estimators = estimators or {}
    if sequential and algorithm.extra_rows is not None:
        raise ConfigError(f"algorithm.name={algorithm.name!r}: its extra rows need one joint update, but "
                          f"{system} updates its roles in turn (multi_agent.params.update: joint)")
    for role, g in sizes.items():
        own = estimators.get(role, algorithm)
        if g < own.min_group:
            key = f"multi_agent.estimators.{role}" if role in estimators else "algorithm.name"
            raise ConfigError(f"{key}={own.name!r}: needs groups of >= {own.min_group} rows, but the "
                              f"{system} role {role!r} has groups of {g}")
    stages = [n for n, f in (("resampling", algorithm.resample), ("reward shaping", algorithm.shaper)) if f]
    if len(set(sizes.values())) > 1 and stages:
        ok = [a.name for a in ALGORITHMS.values()
              if a.resample is None and a.shaper is None and a.min_group <= min(sizes.values())]
        raise ConfigError(f"algorithm.name={algorithm.name!r}: its {stages[0]} needs one group size, but the "
                          f"{system} roles have group sizes {sizes} (allowed: {', '.join(ok)})")


def _lora_setup(cfg: ExperimentConfig, params, mesh, rules):
    """(base, adapters, adapter shardings, base sha256): the frozen base (int8 / nf4 kernels under QLoRA) and
    fresh adapters (B = 0, so step 0 is the base model)."""
    from jaxrl.io import lora_io
    from jaxrl.models import quant
    from jaxrl.sharding.lora import adapter_shardings

    lora_cfg = cfg.model.lora
    base_sha = lora_io.base_fingerprint(params)
    adapters = lora.init_adapters(params, lora_cfg, jax.random.key(cfg.train.seed + 3))
    shardings = adapter_shardings(adapters, mesh, rules)
    adapters = hosts.place_global(adapters, shardings)
    base = params if cfg.model.quantize == "none" else quant.quantize_params(params, cfg.model.quantize)
    return base, adapters, shardings, base_sha


def _check_always_shared(cfg: ExperimentConfig, run: Run, algorithm: Algorithm) -> None:
    """`train.share_prompts: always` with a config whose batches can never share prompts is a config error."""
    why = ""
    if cfg.rollout.group_size == 1:
        why = "rollout.group_size is 1"
    elif run.collector.segments:
        why = "multi-agent role segments update unshared"
    elif algorithm.extra_rows is not None:
        why = f"algorithm.name={algorithm.name!r} appends extra rows"
    elif cfg.data.prompts_per_step % row_multiple(run):
        why = (f"data.prompts_per_step={cfg.data.prompts_per_step} groups do not split over the data shards "
               f"x mini-batches x micro-batches ({row_multiple(run)})")
    if why:
        raise ConfigError(f"train.share_prompts: always, but {why}; use auto or never")


def write_resolved_config(cfg: ExperimentConfig, run_dir: Path) -> None:
    if jax.process_index() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_config(cfg))


def save_model_config(ckpt: ckpt_lib.Checkpointer, model_cfg, tokenizer) -> None:
    ckpt.write_model_config(model_io.config_to_json(model_cfg), tokenizer)
