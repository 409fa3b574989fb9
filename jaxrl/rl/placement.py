"""Sampler and trainer on disjoint devices: `mesh.rollout_devices: N` (issue 27 item 2).

N devices form the rollout mesh (FSDP over them, the config's `tensor` axis kept); the others form the training
mesh that `mesh.data x fsdp x tensor` describes. With P processes each gives the sampler the first N / P of
its local devices (N a multiple of P, leaving devices to the trainer on every host) and the trainer the rest;
both meshes list their devices host by host, so the rows a host's sampling devices hold are the rows its
training devices hold (the batch axis splits rows into contiguous blocks in device order). One plug-in
carries it, chosen at setup, so the step has no branch for it: `SamplerDevices` wraps the run's Collector
(built with a graphdef whose activation constraints name the sampler's mesh). It puts the sampling parameters
it is given (LoRA: base and adapters merged) on the sampler's mesh, reported as `time/weight_sync`, and moves
the device arrays of every rollout (tokens, the sampler's log-probs) to the training mesh with their
partition spec kept, before any trainer program reads them. Everything the trainer computes from the sampling
parameters (old log-probs recomputed, reward shaping, the critic) keeps them on the training mesh. Host-side
rows (episodes' masks, rewards, text) are untouched.

How arrays move (`put_on`): on one process by `jax.device_put`, device to device. Across processes
`jax.device_put` refuses two device sets (jax 0.10.2: "For a cross-host reshard in multi-controller JAX, input
and target sharding should have the same set of devices"; only TFRT TPU has an experimental path), and a jitted
identity cannot have them either, so each process builds its own shards of the target (`_local_plan`): a
target block is cut from a source block on a device of the same process that holds it, or assembled there from
the source blocks that tile it (a sampler with fewer devices than the trainer holds coarser parameter blocks),
each piece a single-device `jax.device_put` (a local device-to-device copy on accelerators, no host copy), and
the shards become one array with `jax.make_array_from_single_device_arrays`. The layout above makes that the
case for the rollout's rows and for parameters split over FSDP on both sides (`jax.make_mesh` keeps the device
order on CPU and sorts GPUs by id, host by host; on TPU it orders by the torus, not checked here). A target
block that another host holds part of (a tensor group or a row block spanning hosts on one side only) goes
through the host: the array is all-gathered to every process, which cuts its own shards (`hosts.to_host` /
`hosts.host_to_global`): correct, but a whole copy per step. Every process takes the same decision, from the
two shardings alone.

Sampling does not depend on where rows sit (each row's random stream is keyed by its row id,
`jaxrl.sampling.generate_from_state`) and the training mesh is the same shape as a run without rollout devices
on the remaining ones, so a run on 8 devices with `rollout_devices: 4` trains exactly as a run on 4 devices
without, and 2 processes x 4 devices with `rollout_devices: 4` as 1 x 8 (tests). With
`train.async.max_staleness >= 1` and one process the collection then overlaps the update in the feed's
background thread (`jaxrl.rl.ahead`): no program runs on both device sets, so the two threads cannot enter
collectives in different orders (the hazard that keeps a shared-device run collecting in place). With several
processes the collection still runs in place: its host exchanges (`hosts.gather_owned`, `hosts.agree`) are
programs over every device of every host.

Not yet: per-role LoRA adapters (their sampling parameters are built per role on demand: exit 2).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from jaxrl.errors import ConfigError
from jaxrl.sharding import MeshConfig, hosts, make_mesh
from jaxrl.types import Rows


def split_devices(devices: Sequence[jax.Device], rollout: int) -> tuple[list[jax.Device], list[jax.Device]]:
    """(the sampler's devices, the trainer's): of each process's devices (in `devices`' order) the first
    rollout / P and the rest, each side listed process by process. Raises ConfigError when that leaves either
    side empty on some process, or `rollout` is not a multiple of the P processes."""
    by_process: dict[int, list[jax.Device]] = {}
    for d in devices:
        by_process.setdefault(d.process_index, []).append(d)
    local = [by_process[p] for p in sorted(by_process)]
    processes, fewest, total = len(local), min(len(ds) for ds in local), sum(len(ds) for ds in local)
    if processes == 1 and not 0 < rollout < total:
        raise ConfigError(f"mesh.rollout_devices={rollout}: must leave devices to both sides, between 1 and "
                          f"{total - 1} of the {total} devices")
    if rollout % processes or not 0 < rollout // processes < fewest:
        raise ConfigError(f"mesh.rollout_devices={rollout}: must be a multiple of the {processes} processes that "
                          f"leaves devices to both sides on each, between {processes} and "
                          f"{processes * (fewest - 1)} (each process gives rollout_devices / {processes} of its "
                          f"{fewest} devices to the sampler)")
    per = rollout // processes
    return [d for ds in local for d in ds[:per]], [d for ds in local for d in ds[per:]]


def rollout_mesh(cfg: MeshConfig, devices: Sequence[jax.Device]) -> Mesh:
    """The sampler's mesh: FSDP over `devices`, with the config's tensor axis and rule table."""
    tensor = max(cfg.tensor, 1)
    if len(devices) % tensor:
        raise ConfigError(f"mesh.rollout_devices={len(devices)}: must be a multiple of mesh.tensor={tensor}")
    return make_mesh(MeshConfig(data=1, fsdp=-1, tensor=tensor, rules=cfg.rules), devices)


def check_slots(slots: int | None, mesh: Mesh) -> None:
    """`rollout.engine.slots` must split evenly over the sampler's batch shards (its mesh's data x fsdp): the
    slots are the decode rows, so a count they do not divide would replicate rows (duplicated work) and lay
    them out unlike the static engine's (the same tokens, log-probs equal only to float rounding); and at
    least 2 per shard, since a device's one-row decode step can round unlike its several-row one."""
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if slots is not None and (slots % shards or slots < 2 * shards):
        raise ConfigError(f"rollout.engine.slots={slots}: must be a multiple of the sampler's {shards} batch "
                          f"shards (mesh.data x mesh.fsdp of the devices that sample), at least 2 per shard "
                          f"(>= {2 * shards}: a one-row decode step rounds unlike the static batch's)")


def _spec_on(x: jax.Array, mesh: Mesh) -> PartitionSpec:
    """`x`'s partition spec for `mesh`: a dimension the new axis sizes do not divide is replicated."""
    spec = tuple(x.sharding.spec) if isinstance(x.sharding, NamedSharding) else ()
    parts = []
    for dim, axes in zip(x.shape, spec + (None,) * (x.ndim - len(spec))):
        names = () if axes is None else axes if isinstance(axes, tuple) else (axes,)
        size = math.prod(mesh.shape[a] for a in names)
        parts.append(axes if dim % size == 0 else None)
    return PartitionSpec(*parts)


def put_on(tree: Any, mesh: Mesh) -> Any:
    """`tree` with every device array not already on `mesh` put there (`_spec_on`; module docstring: device to
    device, across processes each host's own shards)."""
    on = set(mesh.devices.flat)

    def move(x):
        if not isinstance(x, jax.Array) or set(x.sharding.device_set) <= on:
            return x
        target = NamedSharding(mesh, _spec_on(x, mesh))
        if x.is_fully_addressable:  # one process; or a leaf whole on every process (`hosts.place_global`)
            return hosts.place_global(x, target)
        plan = _local_plan(x.sharding, target, x.shape)
        if plan is None:  # some target block is partly on other hosts only: through the host
            return hosts.host_to_global(hosts.to_host(x), target)
        return _move_local(x, target, plan)

    return jax.tree.map(move, tree)


Block = tuple[tuple[int, int], ...]  # (start, stop) of each dimension


def _blocks(sharding: Sharding, shape: tuple[int, ...]) -> dict[jax.Device, Block]:
    """Each device's block of an array of `shape` under `sharding`."""
    return {d: tuple(s.indices(n)[:2] for s, n in zip(index, shape))
            for d, index in sharding.devices_indices_map(shape).items()}


def _within(inner: Block, outer: Block) -> tuple[slice, ...]:
    """`inner`'s place in `outer` as slices of `outer`'s block."""
    return tuple(slice(c - a, e - a) for (a, _), (c, e) in zip(outer, inner))


@functools.lru_cache(maxsize=512)
def _local_plan(source: Sharding, target: Sharding, shape: tuple[int, ...]) -> dict | None:
    """How each target device's block is made from source blocks of its own process: {target device: (block
    shape, [(source device, slices of its block, slices of the target block)])}, one source block that holds
    the target block where there is one (the same block preferred), else the distinct blocks that tile it
    (a NamedSharding's distinct blocks do not overlap). None when some target block is not all on its own
    process; the same answer on every process (it reads the shardings only)."""
    have, want = _blocks(source, shape), _blocks(target, shape)
    distinct: dict[int, dict[Block, jax.Device]] = {}
    for s, block in have.items():
        distinct.setdefault(s.process_index, {}).setdefault(block, s)
    plan = {}
    for d, block in want.items():
        mine = distinct.get(d.process_index, {})
        size = tuple(e - c for c, e in block)
        holders = [b for b in mine if all(a <= c and e <= z for (a, z), (c, e) in zip(b, block))]
        if holders:
            b = block if block in mine else holders[0]
            plan[d] = (size, [(mine[b], _within(block, b), _within(block, block))])
            continue
        parts, covered = [], 0
        for b, s in mine.items():
            part = tuple((max(a, c), min(z, e)) for (a, z), (c, e) in zip(b, block))
            if all(lo < hi for lo, hi in part):
                parts.append((s, _within(part, b), _within(part, block)))
                covered += math.prod(hi - lo for lo, hi in part)
        if covered < math.prod(size):
            return None
        plan[d] = (size, parts)
    return plan


def _cut(data: jax.Array, slices: tuple[slice, ...]) -> jax.Array:
    """`data[slices]`, without an op when they are the whole of it."""
    whole = all(s.start == 0 and s.stop == n for s, n in zip(slices, data.shape))
    return data if whole else data[slices]


def _move_local(x: jax.Array, target: Sharding, plan: dict) -> jax.Array:
    """`x` on `target`, this process's target shards copied from its own source shards (`_local_plan`)."""
    shards = {shard.device: shard.data for shard in x.addressable_shards}
    pieces = []
    for d in target.addressable_devices:
        size, parts = plan[d]
        if len(parts) == 1:  # one source block holds it
            pieces.append(jax.device_put(_cut(shards[parts[0][0]], parts[0][1]), d))
            continue
        block = jnp.zeros(size, x.dtype, device=d)
        for s, src, dst in parts:
            block = block.at[dst].set(jax.device_put(_cut(shards[s], src), d))
        pieces.append(block)
    return jax.make_array_from_single_device_arrays(x.shape, target, pieces)


def to_mesh(rows: Rows, mesh: Mesh) -> Rows:
    """`rows` (a Rollout too) with its device arrays (tokens, the sampler's log-probs) on `mesh`."""
    return dataclasses.replace(rows, **{f.name: put_on(getattr(rows, f.name), mesh)
                                        for f in dataclasses.fields(Rows) if f.name != "completions"})


class SamplerDevices:
    """A Collector that samples on the sampler's mesh and hands its rollouts to the trainer's (module
    docstring). The parameters it is given (the trainer's sampling parameters) are put on the sampler's mesh
    first; the seconds that takes are the rollout's `time/weight_sync` (the step moves them to that stage).

    Args:
      inner: the run's collector, built with the sampler's graphdef and mesh.
      sampler_mesh, train_mesh: the two meshes.
    """

    def __init__(self, inner, sampler_mesh: Mesh, train_mesh: Mesh):
        self.inner, self.sampler_mesh, self.train_mesh = inner, sampler_mesh, train_mesh

    def __call__(self, params, records, spec, key, *, train: bool):
        t0 = time.perf_counter()
        placed = jax.block_until_ready(put_on(params, self.sampler_mesh))
        sync_s = time.perf_counter() - t0
        rollout = to_mesh(self.inner(placed, records, spec, key, train=train), self.train_mesh)
        rollout.metrics["time/weight_sync"] = rollout.metrics.get("time/weight_sync", 0.0) + sync_s
        return rollout

    def first_segment(self, params, records, spec, key, split: int):
        """Partial rollouts (`jaxrl.rl.partial`): the inner collector's first segment on the sampler's mesh."""
        return self.inner.first_segment(jax.block_until_ready(put_on(params, self.sampler_mesh)), records, spec,
                                        key, split)

    def continuation(self, first, split: int) -> "SamplerDevices":
        """The inner collector's continuation of `first`, placed like this collector."""
        return SamplerDevices(self.inner.continuation(first, split), self.sampler_mesh, self.train_mesh)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
