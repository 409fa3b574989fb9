"""A rollout's train batch and the optimiser steps over it, the two stages an `UpdateSchedule` runs:

    batch, metrics = assemble(run, params, ro, adv)   # advantages, old / reference log-probs, mismatch weights
    state, metrics = update(run, state, batch, step)  # PPO epochs x mini-batches of the jitted, donated step

Each mini-batch's forward may run over packed rows (`train.packing: auto`, `jaxrl.rl.packing.RLPacker`).

A batch of whole GRPO groups runs each prompt once per group in the update and log-prob passes
(`TrainBatch.group`; `prompt_groups` says which batches do, `train.share_prompts` switches it).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import losses
from jaxrl.runtime import step_time
from jaxrl.errors import UserError
from jaxrl.rl.run import Run
from jaxrl.sharding import batch_shardings, hosts, logical_to_spec, rows as rows_lib
from jaxrl.learner.train_step import TrainBatch, TrainState


def shard_batch(run: Run, batch: TrainBatch) -> TrainBatch:
    """The batch on the mesh, rows over the batch axis: host arrays (the same on every host) are cut into
    each host's rows (`hosts.host_to_global`), global arrays (a rollout's tokens) resharded on the devices."""
    shardings = batch_shardings(jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), batch),
                                run.mesh, run.rules)
    return jax.tree.map(lambda x, s: rows_lib.reshard(x, s) if rows_lib.is_device(x)
                        else hosts.host_to_global(np.asarray(x), s), batch, shardings)


def row_multiple(run: Run) -> int:
    """Rows a train batch must be a multiple of: the batch axis's shards x mini-batches x micro-batches."""
    return rows_multiple_of(run.mesh, run.rules, run.update.mini_batches, run.loss.grad_accum)


def rows_multiple_of(mesh, rules, mini_batches: int, grad_accum: int) -> int:
    """`row_multiple` from its parts (`jaxrl plan --compile` has no `Run`)."""
    spec = logical_to_spec(("batch",), rules)[0]
    axes = () if spec is None else (spec if isinstance(spec, tuple) else (spec,))
    shards = int(np.prod([mesh.shape[a] for a in axes], dtype=np.int64))
    return shards * mini_batches * grad_accum


def shares_whole_groups(rows: int, group: int, multiple: int) -> bool:
    """Whether `rows` split into whole groups of `group` per data shard x mini-batch x micro-batch
    (`multiple`, `row_multiple`): the row-count condition of `prompt_groups`."""
    return group > 1 and rows % (group * multiple) == 0


def pad_rows(extra, n_rollout: int, multiple: int):
    """`extra` (a `TrainBatch`: AFRL's expert rows, or one role's rows; or the critic's `ValueBatch`) padded
    with copies of its first row that train on nothing (completion mask off, SFT weight 0), so that rollout +
    extra rows split evenly over the batch shards x mini-batches x micro-batches (`multiple`): such a row adds
    no term to any loss and no count to any normaliser (rows and tokens are counted from the masks)."""
    k = -(n_rollout + extra.tokens_BL.shape[0]) % multiple
    if k == 0:
        return extra

    def pad(name, a):
        fill = rows_lib.take(a, np.zeros((k,), np.int32))
        if name in ("completion_mask_BT", "sft_weight_B"):
            fill = np.zeros(fill.shape, fill.dtype)
        return rows_lib.concat([a, fill])

    arrays = [f.name for f in dataclasses.fields(extra)  # not the static `group`
              if f.metadata.get("pytree_node", True) and getattr(extra, f.name) is not None]
    return extra.replace(**{name: pad(name, getattr(extra, name)) for name in arrays})


def prompt_groups(run: Run, ro, *, extra_rows: bool = False) -> tuple[int, str]:
    """(G, "") when the update and log-prob passes of this rollout can run each prompt once per group
    (`TrainBatch.group`, `jaxrl.models.shared_prompt`), else (1, why not).

    Shared (`train.share_prompts: auto`, the default): single-turn and multi-turn (`env:`) GRPO-family
    rollouts, DAPO's resampled batches (whole groups by construction), with or without mini-batches, gradient
    accumulation, KL, mismatch correction, LoRA / QLoRA, on any mesh; when

      * G = `rollout.group_size` > 1,
      * the rows split into whole groups per data shard x mini-batch x micro-batch (`row_multiple`; then no
        group straddles a shard, a mini-batch or a micro-batch), and
      * the G rows of each group have identical prompt columns (checked on the devices: one [B, W] compare).

    Unshared (the plain forward): `train.share_prompts: never`; groups of 1; multi-agent role segments (each
    role its own group size and, in a sequential update, padding rows); extra rows appended to the rollout
    (AFRL SFT-aux expert rows, one per prompt); row counts that do not split as above. `always` raises in
    these cases instead (a config that can never share is refused at setup, `_check_always_shared`).
    """
    if run.share_prompts == "never":
        return 1, "train.share_prompts is never"
    g, n = run.settings.group_size, ro.completion_mask_BT.shape[0]
    why = ""
    if g == 1:
        why = "groups of 1 (rollout.group_size: 1)"
    elif ro.segment_B is not None:
        why = "multi-agent role segments"
    elif extra_rows:
        why = "extra rows (SFT-aux) are appended"
    elif ro.prompt_width < 1:
        why = "no prompt columns"
    elif not shares_whole_groups(n, g, row_multiple(run)):
        why = (f"{n} rows do not split into whole groups of {g} per data shard x mini-batch x micro-batch "
               f"({row_multiple(run)})")
    elif not _same_prompts(ro.tokens_BL, ro.mask_BL, ro.prompt_width, g):
        why = f"the {g} rows of a group differ in their prompt columns"
    if why and run.share_prompts == "always":
        raise UserError(f"train.share_prompts: always, but this batch cannot share prompts: {why}")
    return (1, why) if why else (g, "")


@functools.partial(jax.jit, static_argnums=(1, 2))
def _same_prompt_tokens(tokens_BL, width: int, group: int):
    prompt_PGW = tokens_BL[:, :width].reshape(-1, group, width)
    return jnp.all(prompt_PGW == prompt_PGW[:, :1])


def _same_prompts(tokens_BL, mask_BL, width: int, group: int) -> bool:
    """Whether the rows of every group of `group` consecutive rows have identical prompt columns (tokens,
    padding included, and mask)."""
    mask_PGW = np.asarray(mask_BL)[:, :width].reshape(-1, group, width)
    if not (mask_PGW == mask_PGW[:, :1]).all():
        return False
    if rows_lib.is_device(tokens_BL):
        return bool(hosts.to_host(_same_prompt_tokens(tokens_BL, width, group)))
    tokens_PGW = np.asarray(tokens_BL)[:, :width].reshape(-1, group, width)
    return bool((tokens_PGW == tokens_PGW[:, :1]).all())


def assemble(run: Run, params, ro, adv, *, extra_rows: TrainBatch | None = None, recompute_old: bool = False,
             pad: bool = False, clock: step_time.StageClock | None = None
             ) -> tuple[TrainBatch, dict[str, float]]:
    """The completion-space train batch of a rollout (advantages, old and reference log-probs, importance
    weights of the mismatch correction) and the metrics: mismatch, and `train/shared_prompts` (1 when the
    batch runs each prompt once per group, `prompt_groups`).

    recompute_old: take the old log-probs at `params` even when the run uses the sampler's (a later phase of
    a sequential multi-agent update starts from the policy the previous phase left).
    pad: pad the rows to the batch shards x mini-batches with rows that train on nothing (`pad_rows`; one
    role's rows in a sequential update need not divide them).
    clock: gets the seconds of the old and reference log-prob passes (`old_logprobs`, `ref_logprobs`), which
    run over packed rows where the update's packer packs (`train.packing: auto`, `train/packed_logprobs`)."""
    clock = clock or step_time.StageClock()
    n, t = ro.completion_mask_BT.shape
    zeros = np.zeros((n, t), np.float32)
    group, _ = prompt_groups(run, ro, extra_rows=extra_rows is not None or pad)
    batch = TrainBatch(ro.tokens_BL, ro.mask_BL, ro.completion_mask_BT, ro.old_logp_BT, zeros,
                       np.asarray(adv.adv_BT, np.float32), adv.clip_low_B, adv.clip_high_B,
                       np.zeros((n,), np.float32), group=group)
    if extra_rows is not None:
        extra_rows = pad_rows(extra_rows, n, row_multiple(run))
        batch = jax.tree.map(lambda a, b: rows_lib.concat([a, b]), batch, extra_rows)
    elif pad:
        batch = pad_rows(batch, 0, row_multiple(run))
    batch = shard_batch(run, batch)
    metrics: dict[str, float] = {"train/shared_prompts": float(group > 1)}
    old_pass = recompute_old or not run.logprobs_from_sampler or run.mismatch.mode != "off"
    packed = None
    if run.packer is not None and (old_pass or run.loss.kl_beta > 0):  # log-prob passes over packed rows
        packed = run.packer(batch)[0].packed  # (where that saves work; None: the padded pass)
        metrics["train/packed_logprobs"] = float(packed is not None)
    if old_pass:
        sampler_BT = batch.old_logp_BT
        with clock("old_logprobs"):
            old_BT = step_time.synced(run.logprob_fn(params, batch.tokens_BL, batch.mask_BL, t, group,
                                                     packed=packed) * batch.completion_mask_BT)
        batch = batch.replace(old_logp_BT=old_BT)
        batch, mismatch_metrics = _mismatch(run, batch, sampler_BT, n)
        metrics.update(mismatch_metrics)
    if run.loss.kl_beta > 0:
        with clock("ref_logprobs"):
            ref_BT = step_time.synced(run.logprob_fn(run.policy.reference, batch.tokens_BL, batch.mask_BL, t,
                                                     group, packed=packed))
        batch = batch.replace(ref_logp_BT=ref_BT)
    for stage in run.batch_stages:
        batch, stage_metrics = stage(batch, clock)
        metrics.update(stage_metrics)
    return batch, metrics


# One compiled program each, read back at once: eager jnp on arrays that span several processes would run
# each reduction as its own program, and on CPU (gloo) independent programs with collectives in flight
# together can enter their all-reduces in different orders on different processes and hang.
_mismatch_metrics = jax.jit(losses.mismatch_metrics, static_argnames=("cap", "max_log_ratio"))


_rollout_correction = jax.jit(losses.rollout_correction, static_argnames=("level", "mode", "lower", "upper",
                                                                         "batch_normalize", "max_log_ratio",
                                                                         "reject"))


def _mismatch(run: Run, batch: TrainBatch, sampler_BT, n_rollout: int) -> tuple[TrainBatch, dict[str, float]]:
    """Mismatch metrics of the rollout rows, and (mode tis / mis) the correction weights on the batch."""
    m = run.mismatch
    rollout_rows = jnp.arange(batch.tokens_BL.shape[0])[:, None] < n_rollout  # expert rows were not sampled
    mask_BT = batch.completion_mask_BT & rollout_rows
    if m.mode == "off":
        out = _mismatch_metrics(batch.old_logp_BT, sampler_BT, mask_BT, cap=m.upper or 2.0)
        return batch, {k: float(v) for k, v in jax.device_get(out).items()}
    weights_BT, keep_BT, out = _rollout_correction(
        batch.old_logp_BT, sampler_BT, mask_BT, level=m.level, mode="truncate" if m.mode == "tis" else "mask",
        lower=m.lower, upper=m.upper, reject=m.reject)
    metrics = {k: float(v) for k, v in jax.device_get(out).items()}
    weights_BT = jnp.where(rollout_rows, weights_BT, 1.0)  # expert rows keep weight 1 (they train on SFT only)
    keep_BT = jnp.where(rollout_rows, keep_BT, batch.completion_mask_BT)
    batch = batch.replace(is_weight_BT=weights_BT.astype(jnp.float32),
                          completion_mask_BT=batch.completion_mask_BT & keep_BT)
    return batch, metrics


def minibatch_rows(n: int, group: int, u, step: int, stream: int = 0):
    """The rows of each mini-batch of PPO epochs x mini-batches over `n` rows, in order: rows shuffled per
    epoch with a (seed, step[, stream])-seeded RNG, whole groups of `group` consecutive rows kept together
    (`u`: the run's `UpdateSpec`; one mini-batch: every row in order)."""
    if n % u.mini_batches:
        raise UserError(f"algorithm.mini_batches={u.mini_batches} does not divide the {n} rows of a batch")
    size = n // u.mini_batches
    if size % group:
        raise ValueError(f"mini-batches of {size} rows split the prompt groups of {group} rows")
    rng = np.random.default_rng([u.seed, step] + ([stream] if stream else []))
    for _ in range(u.ppo_epochs):
        if u.mini_batches == 1:
            order = np.arange(n)
        else:  # groups of g consecutive rows (g = 1: rows)
            order = (rng.permutation(n // group)[:, None] * group + np.arange(group)[None, :]).reshape(-1)
        for j in range(u.mini_batches):
            yield order[j * size:(j + 1) * size]


def minibatch_steps(run: Run, step_fn, state, batch, rows_of) -> tuple[object, dict[str, float]]:
    """`step_fn(state, mini-batch)` over the mini-batches `rows_of` yields (`minibatch_rows`); the metrics
    are averaged over the optimiser steps (the non-finite flag: their max)."""
    collected: list[dict] = []
    whole = run.update.mini_batches == 1
    for rows in rows_of:
        take = lambda x: rows_lib.take(x, rows)  # noqa: B023 -- used immediately, inside this iteration
        state, metrics = step_fn(state, batch if whole else shard_batch(run, jax.tree.map(take, batch)))
        collected.append(metrics)
    host = jax.device_get(collected)
    out = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
    out["train/nonfinite"] = float(max(m["train/nonfinite"] for m in host))
    return state, out


def update(run: Run, state: TrainState, batch: TrainBatch, step: int) -> tuple[TrainState, dict[str, float]]:
    """PPO epochs x mini-batches over one rollout batch (rows shuffled per epoch with a step-seeded RNG; a
    shared-prompt batch, `batch.group` > 1, shuffles whole groups, so each mini-batch holds whole groups).
    `state` is the policy's train view (`Policy.train_view`: with per-role adapters, one role's)."""
    rows_of = minibatch_rows(batch.tokens_BL.shape[0], batch.group, run.update, step)
    step_fn = run.step_fn if run.packer is None else functools.partial(_packed_step, run)
    return minibatch_steps(run, step_fn, state, batch, rows_of)


def _packed_step(run: Run, state: TrainState, batch: TrainBatch):
    """One optimiser step on the mini-batch, its forward over packed rows where that saves work
    (`train.packing: auto`, `jaxrl.rl.packing.RLPacker`), with the packer's metrics."""
    batch, info = run.packer(batch)
    state, metrics = run.step_fn(state, batch)
    return state, {**metrics, **info}
