"""`train(cfg, run_dir)`: SFT warm start (optional), then RL steps with hooks between them.

Hooks (metrics, sample completions, held-out evaluation, checkpoints, preemption) run between steps. The step
itself is `jaxrl.trainer.update` over a batch built by `jaxrl.trainer.assemble`.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl import checkpoint as ckpt_lib, losses, rollout as rollout_lib, trainer
from jaxrl.algos import ADVANTAGES, combined_reward
from jaxrl.build import advantage_spec, sampling_spec
from jaxrl.config import Algo, ExperimentConfig
from jaxrl.data.pipeline import Encoder, eval_batches, make_splits, train_iterator
from jaxrl.errors import CheckpointError
from jaxrl.metrics import MetricsWriter
from jaxrl.train_step import LossSpec, TrainState, train_step, update_compiler_options

log = logging.getLogger(__name__)

TIMING_PREFIX = "timing/"


def _seed(cfg: ExperimentConfig, step: int, stream: int) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(cfg.train.seed), step), stream)


def sft_warm_start(run: trainer.Run, state: TrainState, records, encoder) -> tuple[TrainState, list[float]]:
    """Supervised warm start on reference targets with its own AdamW (lr `sft_warmup.lr`); returns (state,
    NLL curve)."""
    cfg = run.cfg
    w = cfg.sft_warmup
    tx = optax.adamw(w.lr)
    spec = LossSpec(policy_weight=0.0, sft_lambda=1.0)
    step_fn = jax.jit(functools.partial(train_step, graphdef=run.graphdef, spec=spec, tx=tx),
                      donate_argnums=0, compiler_options=update_compiler_options())
    sft_state = TrainState(state.params, tx.init(state.params), jnp.zeros((), jnp.int32))
    rng = np.random.default_rng([cfg.train.seed, 7])
    gen_width = cfg.rollout.max_new_tokens
    width = max(len(encoder(r)["prompt_ids"]) for r in records[:256])
    width = min(b for b in cfg.rollout.prompt_buckets if b >= width) if cfg.rollout.prompt_buckets else width
    curve = []
    for k in range(w.steps):
        idx = rng.choice(len(records), size=w.batch_size, replace=False)
        batch = trainer.sft_rows([encoder(records[i], k) for i in idx], run.tokenizer, width, gen_width)
        sft_state, metrics = step_fn(sft_state, trainer._shard_batch(run, batch))
        curve.append(float(metrics["sft/nll"]))
    return TrainState(sft_state.params, state.opt_state, state.step), curve


def evaluate(run: trainer.Run, params, records, encoder) -> dict[str, float]:
    """Greedy completions of the held-out prompts; per-reward means and `eval/accuracy` (first reward > 0)."""
    cfg = run.cfg
    spec = rollout_lib.SamplingSpec(group_size=1, max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0,
                                    prompt_buckets=tuple(cfg.rollout.prompt_buckets),
                                    gen_buckets=tuple(cfg.rollout.gen_buckets))
    scores = []
    for batch in eval_batches(records, encoder, max(cfg.data.prompts_per_step, 1)):
        ro = rollout_lib.collect(run.graphdef, params, batch, run.tokenizer, cfg.rewards, spec, seed=0)
        scores.append(ro.rewards_NK)
        names = ro.reward_names
    r_NK = np.concatenate(scores)
    out = {f"eval/reward/{name}/mean": float(np.nanmean(r_NK[:, k])) for k, name in enumerate(names)}
    out["eval/accuracy"] = float(np.mean(np.nan_to_num(r_NK[:, 0]) > 0))
    return out


def _dynamic_sampling(run, params, records, step, first: rollout_lib.Rollout
                      ) -> tuple[rollout_lib.Rollout, dict]:
    """DAPO: resample until the batch is full of groups whose rewards are not all equal (or tries run out)."""
    cfg = run.cfg
    g, p = cfg.rollout.group_size, len(records)
    parts, tries = [first], 0
    # A group is kept when its rewards are not all equal (`losses.dynamic_sampling_mask`), computed on the
    # host: the merged batch changes size every round, and a jnp version would compile for each size.
    keep = lambda ro: np.ptp(total_reward(ro).reshape(-1, g), axis=1) > 0
    while sum(int(keep(x).sum()) for x in parts) < p and tries < cfg.algorithm.dynamic_sampling_max_tries:
        tries += 1
        parts.append(rollout_lib.collect(run.graphdef, params, records, run.tokenizer, cfg.rewards,
                                         sampling_spec(cfg), seed=_seed(cfg, step, 100 + tries)))
    merged = rollout_lib.concat(parts, g, int(run.tokenizer.pad_token_id))
    good = np.flatnonzero(keep(merged))
    bad = np.flatnonzero(~keep(merged))
    chosen = np.concatenate([good, bad])[:p]  # fill with degenerate groups (advantage 0) if tries ran out
    out = rollout_lib.select_groups(merged, np.sort(chosen), g)
    out.metrics = {**first.metrics, "dapo/resample_rounds": float(tries),
                   "dapo/kept_groups_frac": float(min(len(good), p) / p)}
    return out, out.metrics


def total_reward(ro: rollout_lib.Rollout) -> np.ndarray:
    """The weighted sum of a rollout's rewards per sample, with skipped (NaN) rewards counted as 0."""
    return combined_reward(np.nan_to_num(ro.rewards_NK), ro.weights_K)


class Clipo:
    """CLIPO's contrastive head, trained alongside the policy with its own AdamW (arXiv:2603.10101)."""

    def __init__(self, run: trainer.Run, hidden_dim: int):
        a = run.cfg.algorithm
        self.cfg = losses.ContrastiveHeadConfig(in_dim=hidden_dim, out_dim=a.clipo_head_dim)
        # Committed and replicated from the start: the jitted head step returns committed arrays, and an
        # uncommitted first input would make its second call compile again.
        rep = jax.sharding.NamedSharding(run.mesh, jax.sharding.PartitionSpec())
        self.params = jax.device_put(
            losses.init_contrastive_head(self.cfg, jax.random.key(run.cfg.train.seed + 1)), rep)
        self.tx = optax.adamw(a.clipo_lr, weight_decay=0.01)
        self.opt_state = jax.device_put(self.tx.init(self.params), rep)
        g, tau = run.cfg.rollout.group_size, a.clipo_tau

        def step(head, opt_state, h_BD, correct_B, key):
            z_BC = losses.apply_contrastive_head(head, h_BD)
            _, per_anchor_B, anchor_B = losses.contrastive_loss(z_BC, correct_B, g, tau=tau, key=key)
            bonus_B = losses.contrastive_bonus(per_anchor_B, correct_B, anchor_B, lam=a.clipo_lambda)
            (loss, metrics), grads = jax.value_and_grad(losses.clipo_head_loss, has_aux=True)(
                head, h_BD, correct_B, g, tau=tau, key=key)
            updates, opt_state = self.tx.update(grads, opt_state, head)
            return optax.apply_updates(head, updates), opt_state, bonus_B, metrics

        graphdef = run.graphdef

        def pooled(params, tokens_BL, mask_BL, loss_mask_BL):
            out = nnx.merge(graphdef, params).forward(tokens_BL, None, mask_BL, return_hidden=True,
                                                      return_logits=False)
            return losses.mean_pool(jax.lax.stop_gradient(out.hidden), loss_mask_BL)

        self._step = jax.jit(step)
        self._pooled = jax.jit(pooled)

    def state_json(self) -> list:
        """Head parameters and optimiser state as JSON lists (float32 values round-trip exactly)."""
        return [np.asarray(x).tolist() for x in jax.tree.leaves((self.params, self.opt_state))]

    def load_state(self, data: list) -> None:
        """Inverse of `state_json` (shapes, dtypes and shardings from the freshly initialised head)."""
        leaves, treedef = jax.tree.flatten((self.params, self.opt_state))
        if len(data) != len(leaves):
            raise CheckpointError(f"CLIPO head state has {len(data)} arrays, expected {len(leaves)}")
        new = [jax.device_put(np.asarray(d, x.dtype).reshape(x.shape), x.sharding)
               for d, x in zip(data, leaves)]
        self.params, self.opt_state = jax.tree.unflatten(treedef, new)

    def bonus(self, params, ro: rollout_lib.Rollout, key) -> tuple[np.ndarray, dict[str, float]]:
        h_BD = self._pooled(params, ro.tokens_BL, ro.mask_BL, ro.loss_mask_BL)
        correct_B = jnp.asarray(np.nan_to_num(ro.rewards_NK[:, 0]) > 0)
        self.params, self.opt_state, bonus_B, metrics = self._step(self.params, self.opt_state, h_BD,
                                                                   correct_B, key)
        out = {k: float(v) for k, v in metrics.items()}
        out["clipo/bonus_mean"] = float(jnp.mean(bonus_B))
        return np.asarray(bonus_B, np.float32), out


def _add_reward_column(ro: rollout_lib.Rollout, values_N: np.ndarray, name: str) -> rollout_lib.Rollout:
    ro.rewards_NK = np.concatenate([ro.rewards_NK, values_N[:, None].astype(np.float32)], axis=1)
    ro.weights_K = np.concatenate([ro.weights_K, np.ones((1,), np.float32)])
    ro.reward_names = (*ro.reward_names, name)
    return ro


def rl_step(run: trainer.Run, state: TrainState, records, encoder, step: int, clipo: Clipo | None):
    """One RL step: rollout, rewards, advantages, update. Returns (state, metrics)."""
    cfg = run.cfg
    t0 = time.perf_counter()
    ro = rollout_lib.collect(run.graphdef, state.params, records, run.tokenizer, cfg.rewards,
                             sampling_spec(cfg), seed=_seed(cfg, step, 0))
    metrics = dict(ro.metrics)
    if cfg.algorithm.dynamic_sampling_max_tries > 0:
        ro, metrics = _dynamic_sampling(run, state.params, records, step, ro)
    g = cfg.rollout.group_size
    total_NK = total_reward(ro)
    metrics["reward/mean"] = float(total_NK.mean())
    metrics["frac_zero_std_groups"] = float(np.mean(total_NK.reshape(-1, g).std(axis=1) == 0))
    t1 = time.perf_counter()
    actor_frozen = False
    if clipo is not None:
        bonus_N, cm = clipo.bonus(state.params, ro, _seed(cfg, step, 2))
        metrics.update(cm)
        ro = _add_reward_column(ro, bonus_N, "clipo_bonus")
        actor_frozen = step < cfg.algorithm.clipo_warmup_steps
    if cfg.algorithm.kl_beta > 0 and cfg.algorithm.kl_in == "reward":
        ref = run.logprob_fn(run.ref_params, ro.tokens_BL, ro.mask_BL)
        kl_BL = losses.kl_penalty(jnp.asarray(ro.old_logp_BL), ref, cfg.algorithm.kl_kind)
        kl_N = np.asarray(jnp.sum(jnp.where(ro.loss_mask_BL, kl_BL, 0.0), axis=1))
        metrics["kl"] = float(kl_N.mean())
        ro = _add_reward_column(ro, -cfg.algorithm.kl_beta * kl_N, "kl_penalty")
    adv = ADVANTAGES[cfg.algorithm.name](ro.rewards_NK, ro.weights_K, ro.completion_mask_NT,
                                         advantage_spec(cfg))
    metrics.update(adv.metrics)
    sft = None
    if cfg.algorithm.name is Algo.SFT_AUX:
        gen_width = ro.tokens_BL.shape[1] - ro.prompt_width
        sft = trainer.sft_rows(records, run.tokenizer, ro.prompt_width, gen_width)
    batch = trainer.assemble(run, state.params, ro, adv, sft_rows=sft)
    t2 = time.perf_counter()
    if not actor_frozen:
        state, upd = trainer.update(run, state, batch, step)
        metrics.update(upd)
    t3 = time.perf_counter()
    tokens = float(np.sum(ro.mask_BL))
    metrics.setdefault("kl", metrics.get("kl/loss", 0.0))
    metrics.setdefault("entropy", metrics.get("entropy/mean", float("nan")))
    metrics.setdefault("clip_frac", metrics.get("pg/clip_frac", float("nan")))
    metrics.update({f"{TIMING_PREFIX}rollout_s": t1 - t0, f"{TIMING_PREFIX}logprob_s": t2 - t1,
                    f"{TIMING_PREFIX}update_s": t3 - t2, "tokens_per_s": tokens / max(t3 - t0, 1e-9)})
    return state, metrics, ro


def train(cfg: ExperimentConfig, run_dir: str | Path, checkpoint_dir: str | None = None) -> dict[str, Any]:
    """Runs (or resumes) the experiment in `run_dir`; returns the last metrics row.

    `checkpoint_dir` (default RUN/checkpoints) may be an object-store URL such as gs://bucket/run/checkpoints.
    """
    run_dir = Path(run_dir)
    trainer.write_resolved_config(cfg, run_dir)
    run, state, model = trainer.setup(cfg, run_dir)
    d = cfg.data
    train_records, eval_records = make_splits(d.source, train_size=d.train_size, eval_size=d.eval_size,
                                              seed=d.seed, params=d.params, prompt_field=d.prompt_field,
                                              answer_field=d.answer_field)
    encoder = Encoder(run.tokenizer, d.system_prompt, d.target_format, tuple(d.target_formats))
    data_it = train_iterator(train_records, encoder, batch_size=d.prompts_per_step, seed=d.seed,
                             process_index=jax.process_index(), process_count=jax.process_count())
    ckpt = ckpt_lib.Checkpointer(checkpoint_dir or run_dir / "checkpoints", every=cfg.checkpoint.every,
                                 keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save)
    trainer.save_model_config(ckpt, model, run.tokenizer)
    clipo = Clipo(run, model.cfg.hidden_size) if cfg.algorithm.name is Algo.CLIPO else None
    del model
    start, nonfinite_run = 0, 0
    initial = state
    restored = ckpt.restore_latest(state.params, state.opt_state) if cfg.checkpoint.resume else None
    if restored is not None:
        start = restored.step
        state = TrainState(restored.params, restored.opt_state, jnp.asarray(start, jnp.int32))
        data_it.set_state(restored.extra["data_state"])
        nonfinite_run = int(restored.extra.get("nonfinite_run", 0))
        if clipo is not None and "clipo" in restored.extra:
            clipo.load_state(restored.extra["clipo"])
        elif clipo is not None:
            log.warning("checkpoint has no CLIPO head state; the head restarts from its initialisation")
        if run.ref_params is not None and cfg.sft_warmup.steps > 0:
            # The reference policy is the warm-started model, which is not checkpointed: replay the
            # (deterministic) warm start from the initial parameters to rebuild it exactly.
            run.ref_params = sft_warm_start(run, initial, train_records, encoder)[0].params
        log.info("resumed from step %d in %s", start, ckpt.directory)
    elif cfg.sft_warmup.steps > 0:
        state, curve = sft_warm_start(run, state, train_records, encoder)
        log.info("SFT warm start: NLL %.3f -> %.3f over %d steps", curve[0], curve[-1], len(curve))
        if run.ref_params is not None:  # KL is measured against the policy RL starts from
            run.ref_params = jax.tree.map(jnp.copy, state.params)
    del initial
    last: dict[str, Any] = {}
    extra = lambda step: {"data_state": data_it.get_state(), "nonfinite_run": nonfinite_run,
                          "rng": ckpt_lib.key_to_json(jax.random.key(cfg.train.seed)),
                          **({"clipo": clipo.state_json()} if clipo is not None else {})}
    bar_steps = cfg.train.steps if cfg.logging.progress_bar else None
    with MetricsWriter(run_dir, resume_step=start, total_steps=bar_steps,
                       tensorboard=cfg.logging.tensorboard) as writer, ckpt_lib.PreemptionGuard() as guard:
        if start == 0 and cfg.train.eval_every:
            writer.write(0, evaluate(run, state.params, eval_records, encoder))
        for step in range(start + 1, cfg.train.steps + 1):
            records = next(data_it)
            state, metrics, ro = rl_step(run, state, records, encoder, step, clipo)
            nonfinite_run = nonfinite_run + 1 if metrics.get("train/nonfinite", 0) else 0
            metrics["train/nonfinite_run"] = float(nonfinite_run)
            if cfg.train.eval_every and step % cfg.train.eval_every == 0:
                metrics.update(evaluate(run, state.params, eval_records, encoder))
            writer.write(step, metrics)
            if step % cfg.logging.sample_every == 0 and cfg.logging.num_samples:
                k = cfg.logging.num_samples
                writer.write_samples(step, [r["prompt"] for r in ro.records[:k]], ro.completions[:k],
                                     list(total_reward(ro)[:k]))
            last = {"step": step, **metrics}
            stop = guard.should_stop()
            too_many = nonfinite_run >= cfg.optimizer.max_nonfinite_steps
            if ckpt.should_save(step) or stop or too_many or step == cfg.train.steps:
                ckpt.save(step, state.params, state.opt_state, extra(step))
            if too_many:
                ckpt.close()
                raise trainer.NonFiniteError(
                    f"{nonfinite_run} consecutive steps had a non-finite loss or gradient (limit "
                    f"optimizer.max_nonfinite_steps={cfg.optimizer.max_nonfinite_steps}); stopped at step "
                    f"{step} "
                    f"with a checkpoint in {ckpt.directory}")
            if stop:
                log.warning("stopping after step %d (preemption); checkpoint saved", step)
                break
    ckpt.close()
    return last

