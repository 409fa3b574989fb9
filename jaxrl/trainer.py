"""The RL training loop: a thin functional loop around the jitted update (STYLE.md principle 14).

    state = init(...)
    for step:
        rollout   = collect(params, prompts)           # jitted sampler + host-side reward functions
        adv       = ADVANTAGES[algo](rewards, ...)      # jaxrl.algos
        batch     = assemble(rollout, adv, logprobs)    # old / reference log-probs recomputed (jitted)
        state, m  = train_step(state, batch)            # jitted, donated; PPO epochs x mini-batches
        hooks: metrics, samples, eval, checkpoint       # between steps, never inside the jitted step

Reproducibility: every random choice is derived from (train.seed, step) with `fold_in`, and the data
iterator's position is checkpointed, so a resumed run repeats exactly the steps an uninterrupted run would
take.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl import build, checkpoint as ckpt_lib, model_io, rollout as rollout_lib
from jaxrl.config import ExperimentConfig, dump_config
from jaxrl.errors import UserError
from jaxrl.sharding import RULES, batch_shardings, make_constrain, make_mesh, state_shardings
from jaxrl.train_step import (LossSpec, TrainBatch, TrainState, sequence_logprobs, train_step,
                              update_compiler_options)

log = logging.getLogger(__name__)


class NonFiniteError(UserError):
    """Too many consecutive steps had a non-finite loss or gradient."""


@dataclasses.dataclass
class Run:
    """Everything set up once for a run (host-side objects and jitted functions)."""

    cfg: ExperimentConfig
    run_dir: Path
    mesh: Any
    graphdef: Any
    tokenizer: Any
    tx: optax.GradientTransformation
    spec: LossSpec
    state_sharding: Any
    step_fn: Any
    logprob_fn: Any
    ref_params: Any


def _pure(params) -> dict:
    return params.to_pure_dict() if hasattr(params, "to_pure_dict") else params


def setup(cfg: ExperimentConfig, run_dir: Path) -> tuple[Run, TrainState, Any]:
    """Builds mesh, model, tokenizer, optimiser and jitted functions; returns (run, initial state, model)."""
    mesh = make_mesh(cfg.mesh)
    rules = RULES[cfg.mesh.rules]
    tokenizer = build.build_tokenizer(cfg.model, cfg.tokenizer)
    model = build.build_model(cfg.model, vocab_size=len(tokenizer), seed=cfg.train.seed,
                              constrain=make_constrain(mesh, rules))
    graphdef, params_state = nnx.split(model)
    tx = build.build_optimizer(cfg.optimizer, cfg.train.steps)
    param_sharding = state_shardings(params_state, mesh, rules)
    params = jax.device_put(_pure(params_state), _pure(param_sharding))
    opt_state = tx.init(params)
    opt_sharding = state_shardings(opt_state, mesh, rules, params=params_state)
    opt_state = jax.device_put(opt_state, opt_sharding)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state_sharding = TrainState(params=_pure(param_sharding), opt_state=opt_sharding, step=rep)
    state = jax.device_put(TrainState(params=params, opt_state=opt_state, step=jnp.zeros((), jnp.int32)),
                           state_sharding)
    kl_in_loss = cfg.algorithm.kl_beta > 0 and cfg.algorithm.kl_in == "loss"
    spec = build.loss_spec(cfg.algorithm, kl_in_loss=kl_in_loss)
    step_fn = jax.jit(functools.partial(train_step, graphdef=graphdef, spec=spec, tx=tx),
                      in_shardings=(state_sharding, None), out_shardings=(state_sharding, None),
                      donate_argnums=0, compiler_options=update_compiler_options())
    def logprobs(params, tokens_BL, mask_BL):
        return sequence_logprobs(params, graphdef, tokens_BL, mask_BL, chunk=spec.logprob_chunk,
                                 temperature=spec.temperature)

    logprob_fn = jax.jit(logprobs)
    # beta = 0 keeps no reference model in memory.
    ref_params = jax.tree.map(jnp.copy, params) if cfg.algorithm.kl_beta > 0 else None
    run = Run(cfg, run_dir, mesh, graphdef, tokenizer, tx, spec, state_sharding, step_fn, logprob_fn,
              ref_params)
    return run, state, model


def _shard_batch(run: Run, batch: TrainBatch) -> TrainBatch:
    arrays = jax.tree.map(np.asarray, batch)
    return jax.device_put(arrays, batch_shardings(arrays, run.mesh, RULES[run.cfg.mesh.rules]))


def assemble(run: Run, params, ro: rollout_lib.Rollout, adv, *, sft_rows=None) -> TrainBatch:
    """The train batch of a rollout: advantages per token, old (and reference) log-probs."""
    n, length = ro.tokens_BL.shape
    adv_BL = np.zeros((n, length), np.float32)
    adv_BL[:, ro.prompt_width:] = adv.adv_NT
    zeros = np.zeros((n, length), np.float32)
    batch = TrainBatch(ro.tokens_BL, ro.mask_BL, ro.loss_mask_BL, ro.old_logp_BL, zeros, adv_BL,
                       adv.clip_low_N, adv.clip_high_N, np.zeros((n,), np.float32))
    if sft_rows is not None:
        batch = jax.tree.map(lambda a, b: np.concatenate([a, b], axis=0), batch, sft_rows)
    batch = _shard_batch(run, batch)
    if not run.cfg.rollout.logprobs_from_sampler:
        old_BL = run.logprob_fn(params, batch.tokens_BL, batch.mask_BL) * batch.loss_mask_BL
        batch = batch.replace(old_logp_BL=old_BL)
    if run.spec.kl_beta > 0:
        batch = batch.replace(ref_logp_BL=run.logprob_fn(run.ref_params, batch.tokens_BL, batch.mask_BL))
    return batch


def sft_rows(records, tokenizer, width: int, gen_width: int) -> TrainBatch:
    """Expert rows (prompt + reference target) laid out like rollout rows; trained with the SFT loss only."""
    pad = int(tokenizer.pad_token_id)
    n = len(records)
    tokens = np.full((n, width + gen_width), pad, np.int32)
    mask = np.zeros(tokens.shape, bool)
    loss_mask = np.zeros(tokens.shape, bool)
    for i, r in enumerate(records):
        p, t = r["prompt_ids"][-width:], r["target_ids"][:gen_width]
        tokens[i, width - len(p):width] = p
        tokens[i, width:width + len(t)] = t
        mask[i, width - len(p):width + len(t)] = True
        loss_mask[i, width:width + len(t)] = True
    zeros = np.zeros(tokens.shape, np.float32)
    ones = np.ones((n,), np.float32)
    return TrainBatch(tokens, mask, loss_mask, zeros, zeros, zeros, ones * 0.2, ones * 0.2, ones)


def update(run: Run, state: TrainState, batch: TrainBatch, step: int) -> tuple[TrainState, dict[str, float]]:
    """PPO epochs x mini-batches over one rollout batch (rows shuffled per epoch with a step-seeded RNG)."""
    a = run.cfg.algorithm
    n = batch.tokens_BL.shape[0]
    if n % a.mini_batches:
        raise UserError(f"algorithm.mini_batches={a.mini_batches} does not divide the {n} rows of a batch")
    size = n // a.mini_batches
    rng = np.random.default_rng([run.cfg.train.seed, step])
    collected: list[dict] = []
    for _ in range(a.ppo_epochs):
        order = rng.permutation(n) if a.mini_batches > 1 else np.arange(n)
        for j in range(a.mini_batches):
            rows = order[j * size:(j + 1) * size]
            take = lambda x: np.asarray(x)[rows]  # noqa: B023 -- used immediately, inside this iteration
            mb = batch if a.mini_batches == 1 else _shard_batch(run, jax.tree.map(take, batch))
            state, metrics = run.step_fn(state, mb)
            collected.append(metrics)
    host = jax.device_get(collected)
    out = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
    out["train/nonfinite"] = float(max(m["train/nonfinite"] for m in host))
    return state, out


def write_resolved_config(cfg: ExperimentConfig, run_dir: Path) -> None:
    if jax.process_index() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_config(cfg))


def save_model_config(ckpt: ckpt_lib.Checkpointer, model, tokenizer) -> None:
    ckpt.write_model_config(model_io.config_to_json(model.cfg), tokenizer)
