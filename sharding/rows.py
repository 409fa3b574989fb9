"""Row operations on batch-sharded global arrays, done on the devices (no host ever holds other hosts' rows).

A rollout's token arrays stay where the sampler left them: a global `jax.Array` whose rows are split over the
batch axis of the mesh, each host holding the rows on its own devices. The RL step still has to move rows
(DAPO keeps some groups and drops others, resampling rounds are concatenated, mini-batches shuffle rows);
on a pod that is a permutation across hosts. Doing it here as a jitted gather lets XLA exchange the rows
between devices; the host only passes the row indices, which every process computes identically from the
gathered rewards. Numpy inputs go through the same functions unchanged (multi-agent rollouts are built on
the host), so callers need not know which kind they hold.

With one process and one device this is `x[rows]`, `np.concatenate` and `np.pad` with the same results,
bit for bit (pure data movement).
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding


def is_device(x) -> bool:
    """Whether `x` is a jax.Array (rows may live on other hosts) rather than a host numpy array."""
    return isinstance(x, jax.Array)


def _like(sharding: Sharding, n: int) -> Sharding:
    """`sharding` for an array of n rows: the same layout when n divides evenly over its row shards,
    otherwise replicated over the same devices (an odd-sized intermediate never becomes a train batch)."""
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = sharding.spec
    axes = spec[0] if len(spec) else None
    axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
    shards = int(np.prod([sharding.mesh.shape[a] for a in axes], dtype=np.int64))
    return sharding if n % shards == 0 else NamedSharding(sharding.mesh, PartitionSpec())


def _replicated(values: np.ndarray, sharding: Sharding) -> jax.Array:
    """A small host array (the same on every process) as a replicated global array on `sharding`'s devices."""
    rep = NamedSharding(sharding.mesh, PartitionSpec()) if isinstance(sharding, NamedSharding) else sharding
    return jax.make_array_from_callback(values.shape, rep, lambda index: values[index])


@functools.lru_cache(maxsize=None)
def _take_fn(out: Sharding):
    return jax.jit(lambda x, rows: jnp.take(x, rows, axis=0), out_shardings=out)


@functools.lru_cache(maxsize=None)
def _concat_fn(out: Sharding):
    return jax.jit(lambda *xs: jnp.concatenate(xs, axis=0), out_shardings=out)


@functools.lru_cache(maxsize=None)
def _pad_fn(out: Sharding, left: int, right: int, fill):
    return jax.jit(lambda x: jnp.pad(x, ((0, 0), (left, right)), constant_values=fill), out_shardings=out)


def take(x, rows: np.ndarray):
    """`x[rows]` (rows: int indices, the same on every process)."""
    rows = np.asarray(rows, np.int32)
    if not is_device(x):
        return np.asarray(x)[rows]
    return _take_fn(_like(x.sharding, rows.shape[0]))(x, _replicated(rows, x.sharding))


def concat(parts: Sequence) -> object:
    """Row-wise concatenation; host parts are placed like the first device part."""
    device = [p for p in parts if is_device(p)]
    if not device:
        return np.concatenate([np.asarray(p) for p in parts], axis=0)
    sharding = device[0].sharding
    placed = [p if is_device(p) else _replicated(np.asarray(p), sharding) for p in parts]
    n = sum(int(p.shape[0]) for p in placed)
    return _concat_fn(_like(sharding, n))(*placed)


def pad_columns(x, left: int, right: int, fill):
    """`x` [N, L] with `left` columns of `fill` before and `right` after."""
    if not left and not right:
        return x
    if not is_device(x):
        return np.pad(np.asarray(x), ((0, 0), (left, right)), constant_values=fill)
    return _pad_fn(x.sharding, int(left), int(right), fill)(x)


@functools.lru_cache(maxsize=None)
def _reshard_fn(out: Sharding):
    return jax.jit(lambda x: x, out_shardings=out)


def reshard(x: jax.Array, sharding: Sharding) -> jax.Array:
    """`x` laid out as `sharding` (on the same devices); a no-op when it already is."""
    if x.sharding == sharding:
        return x
    return _reshard_fn(sharding)(x)
