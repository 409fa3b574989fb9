"""Sampler and trainer on disjoint devices: `mesh.rollout_devices: N` (issue 27 item 2).

The first N devices form the rollout mesh (FSDP over them, the config's `tensor` axis kept); the others form
the training mesh that `mesh.data x fsdp x tensor` describes. One plug-in carries it, chosen at setup, so the
step has no branch for it: `SamplerDevices` wraps the run's Collector (built with a graphdef whose activation
constraints name the sampler's mesh). It puts the sampling parameters it is given (LoRA: base and adapters
merged) on the sampler's mesh with `jax.device_put`, device to device (no host round trip), reported as
`time/weight_sync`, and moves the device arrays of every rollout (tokens, the sampler's log-probs) to the
training mesh with their partition spec kept, before any trainer program reads them. Everything the trainer
computes from the sampling parameters (old log-probs recomputed, reward shaping, the critic) keeps them on the
training mesh. Host-side rows (episodes' masks, rewards, text) are untouched.

Sampling does not depend on where rows sit (each row's random stream is keyed by its row id,
`jaxrl.sampling.generate_from_state`) and the training mesh is the same shape as a run without rollout devices
on the remaining ones, so a run on 8 devices with `rollout_devices: 4` trains exactly as a run on 4 devices
without (test). With `train.async.max_staleness >= 1` the collection then overlaps the update in the feed's
background thread (`jaxrl.rl.ahead`): no program runs on both device sets, so the two threads cannot enter
collectives in different orders (the hazard that keeps a shared-device run collecting in place).

Not yet: several processes (each host's rows would have to move between hosts' devices: exit 2) and per-role
LoRA adapters (their sampling parameters are built per role on demand: exit 2).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl.errors import ConfigError
from jaxrl.sharding import MeshConfig, make_mesh
from jaxrl.types import Rows


def split_devices(devices: Sequence[jax.Device], rollout: int, *, processes: int = 1
                  ) -> tuple[list[jax.Device], list[jax.Device]]:
    """(the sampler's devices, the trainer's): the first `rollout` of `devices`, and the rest. Raises
    ConfigError when that leaves either side empty or the run has several processes."""
    devices = list(devices)
    if processes > 1:
        raise ConfigError(f"mesh.rollout_devices={rollout}: a separate sampler mesh runs on one process for now "
                          f"(this run has {processes}); use mesh.rollout_devices: 0")
    if not 0 < rollout < len(devices):
        raise ConfigError(f"mesh.rollout_devices={rollout}: must leave devices to both sides, between 1 and "
                          f"{len(devices) - 1} of the {len(devices)} devices")
    return devices[:rollout], devices[rollout:]


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
    """`tree` with every device array not already on `mesh` put there, device to device (`_spec_on`)."""
    on = set(mesh.devices.flat)

    def move(x):
        if not isinstance(x, jax.Array) or set(x.sharding.device_set) <= on:
            return x
        return jax.device_put(x, NamedSharding(mesh, _spec_on(x, mesh)))

    return jax.tree.map(move, tree)


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
