"""The supervised warm start before RL: the collector's demonstrations (or the records' reference targets),
laid out like the rows RL will sample, optionally packed several to a row (`jaxrl.rl.packing`), with its own AdamW.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl.rl import packing
from jaxrl.algorithms import expert_rows
from jaxrl.rl.batch import shard_batch
from jaxrl.rl.run import Run, placed_shardings
from jaxrl.sampling import bucket
from jaxrl.sharding import batch_shardings, hosts, row_sharding
from jaxrl.learner.cpu_compile import YNN_DOT, cpu_jit
from jaxrl.learner.train_step import LossSpec, TrainBatch, TrainState, train_step

log = logging.getLogger(__name__)


def sft_warm_start(run: Run, state: TrainState, records, encoder, *, steps: int, lr: float,
                   batch_size: int, packed: bool = False) -> tuple[TrainState, list[float]]:
    """Supervised warm start on reference targets with its own AdamW; returns (state, NLL curve).

    Rows are laid out like rollout rows (prompt bucket | completion width), so the warm start trains exactly
    the positions RL will sample. `packed`: several rows per packed row where that saves rows
    (`jaxrl.rl.packing`; the same loss and gradient up to summation order).
    """
    tx = optax.adamw(lr)
    spec = LossSpec(policy_weight=0.0, sft_lambda=1.0)
    spec = dataclasses.replace(spec, lora=run.loss.lora)  # LoRA: the warm start trains the adapters too
    # The state keeps its input shardings (the scalars, Adam's count and the step, replicated on the mesh):
    # otherwise the step returns the same shardings spelled differently (P(None, 'fsdp') for
    # P(None, 'fsdp', None), a placed scalar for an unplaced one) and the second step compiles again.
    sft_state = TrainState(state.params, tx.init(state.params), jnp.zeros((), jnp.int32))
    shardings = placed_shardings(sft_state, run.mesh)
    sft_state = hosts.place_global(sft_state, shardings)
    jitted = cpu_jit(functools.partial(train_step, graphdef=run.graphdef, spec=spec, tx=tx), fast=YNN_DOT,
                     donate_argnums=0, out_shardings=(shardings, None))
    step_fn = lambda state, batch: jitted(state, batch, run.policy.frozen)
    rng = np.random.default_rng([run.seed, 7])
    draws = [rng.choice(len(records), size=batch_size, replace=False) for _ in range(steps)]
    build = _demonstration_batches(run, records, encoder, batch_size)
    head = [build(k, draws[k]) for k in range(min(steps, PACKING_PROBE))] if packed else []
    packer = _packer(run, head, batch_size) if head else None
    nll = []  # step k's NLL is read after step k + 1 is dispatched: one step in flight while a batch is built
    for k in range(steps):
        batch = head[k] if k < len(head) else build(k, draws[k])
        if packer is not None:
            batch = packer(batch, k)
        sft_state, metrics = step_fn(sft_state, shard_batch(run, batch))
        if nll:
            nll[-1] = float(nll[-1])
        nll.append(metrics["sft/nll"])
        if (k + 1) % max(steps // 10, 1) == 0 or k + 1 == steps:  # progress: ten lines per warm start
            log.info("SFT warm start: step %d/%d, NLL %.4f", k + 1, steps, float(nll[-1]))
    return TrainState(sft_state.params, state.opt_state, state.step), [float(x) for x in nll]


PACKING_PROBE = 64  # the warm start's first batches, built ahead, fix the packed layout


def _demonstration_batches(run: Run, records, encoder, batch_size: int):
    """(step, record indices) -> the warm start's padded SFT batch of those records."""
    demonstrations = run.collector.demonstrations()  # None: the records' reference targets
    completion_width = run.sampling.max_new_tokens
    longest = max(len(encoder(r)["prompt_ids"]) for r in records[:256])
    width = bucket(longest, run.sampling.prompt_buckets, "prompt")

    def build(k: int, idx) -> TrainBatch:
        if demonstrations is not None:  # an environment's or a system's, laid out like the rows it samples
            return demonstrations([records[i] for i in idx],
                                  row_sharding=row_sharding(run.mesh, run.rules, batch_size))
        return expert_rows([encoder(records[i], k) for i in idx], run.tokenizer, width, completion_width)

    return build


def _packer(run: Run, head: list[TrainBatch], batch_size: int):
    """(batch, step) -> the batch packed (`jaxrl.rl.packing`), or None when packing saves nothing. The packed
    layout (rows per block, width) holds every batch of `head` on every host; a later batch that does not fit
    it runs unpacked, on every host alike."""
    def layout(rows: int):
        return batch_shardings(jax.ShapeDtypeStruct((rows,), np.int32), run.mesh, run.rules)

    num, held, of_device = packing.blocks(layout(batch_size), batch_size)
    chosen = packing.choose_layout(head, num, held)
    # every host packs alike: the most rows and the widest rows any host chose
    per_block = hosts.max_across_hosts(batch_size // num if chosen is None else chosen[0])
    width = hosts.max_across_hosts(np.shape(head[0].tokens_BL)[1] if chosen is None else chosen[1])
    packed_rows = per_block * num
    if (per_block * width >= batch_size // num * np.shape(head[0].tokens_BL)[1]
            or packing.blocks(layout(packed_rows), packed_rows)[2] != of_device):
        return None  # no token slots saved, or packed rows would not sit on the devices of their demonstrations
    log.info("SFT warm start: %d demonstrations of %d tokens a step packed into %d rows of %d", batch_size,
             np.shape(head[0].tokens_BL)[1], packed_rows, width)
    logged = False

    def pack(batch: TrainBatch, k: int) -> TrainBatch:
        nonlocal logged
        packed = packing.pack(batch, num, held, per_block, width)
        if hosts.agree(packed is not None):
            return packed
        if not logged:
            log.info("SFT warm start: step %d does not fit %d packed rows of %d; such steps run unpacked",
                     k + 1, packed_rows, width)
            logged = True
        return batch

    return pack
