"""Rows of batch-sharded global arrays across hosts (multi-controller JAX): who holds, who owns, gather.

On a pod every process runs the same program over global `jax.Array`s but can read only the shards on its own
devices. Host-side stages (decoding, reward functions, metrics) therefore work on rows:

* a process *holds* the rows that sit on any of its devices (`held_rows`);
* every row has exactly one *owner*, the lowest-numbered process holding it (`row_owners`): the owner decodes
  and scores it, so no row is scored twice when the batch axis is replicated across hosts;
* small per-row results (rewards, lengths) are exchanged with `gather_owned`, so every process ends with the
  same global numpy array and takes the same decisions (advantages, DAPO keep/resample, metrics);
* `host_to_global` builds a global array from numpy rows this process holds (`make_array_from_callback`:
  each device's shard is cut from the host's copy), for any mesh and device order.

With one process every function is the trivial one (owner 0, everything held), so single- and multi-host runs
share one code path. Nothing here ever reads another host's shards directly.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Sharding


def _row_slices(sharding: Sharding, shape: tuple[int, ...]) -> list[tuple[int, range]]:
    """(process index, rows) of every device's shard of an array of `shape` (leading axis = rows)."""
    out = []
    for device, index in sharding.devices_indices_map(shape).items():
        rows = range(shape[0])[index[0]] if index else range(shape[0])
        out.append((device.process_index, rows))
    return out


def row_blocks(sharding: Sharding, rows: int) -> int:
    """How many distinct blocks of rows `sharding` cuts `rows` rows into (1 when they are replicated)."""
    return len({(r.start, r.stop) for _, r in _row_slices(sharding, (rows,))})


def row_owners(sharding: Sharding, shape: tuple[int, ...]) -> np.ndarray:
    """[N] int32: the owner of each row, the lowest process index among the processes that hold it."""
    owners = np.full((shape[0],), np.iinfo(np.int32).max, np.int32)
    for process, rows in _row_slices(sharding, shape):
        idx = np.asarray(rows, np.int64)
        owners[idx] = np.minimum(owners[idx], process)
    return owners


def held_rows(sharding: Sharding, shape: tuple[int, ...]) -> np.ndarray:
    """[N] bool: the rows on at least one of this process's devices."""
    held = np.zeros((shape[0],), bool)
    me = jax.process_index()
    for process, rows in _row_slices(sharding, shape):
        if process == me:
            held[np.asarray(rows, np.int64)] = True
    return held


def owned_rows(sharding: Sharding, shape: tuple[int, ...]) -> np.ndarray:
    """[n] int64: the sorted row indices this process owns (decodes, scores)."""
    return np.flatnonzero(row_owners(sharding, shape) == jax.process_index())


def shared_rows(sharding: Sharding, shape: tuple[int, ...]) -> bool:
    """Whether some row sits on the devices of more than one process (a batch axis that does not span the
    processes, or too few rows to split), so that its holders need its owner's values."""
    holders: dict[int, set[int]] = {}
    for process, rows in _row_slices(sharding, shape):
        for r in rows:
            holders.setdefault(r, set()).add(process)
    return any(len(p) > 1 for p in holders.values())


def fetch_held(x: jax.Array, fill: Any = 0) -> np.ndarray:
    """A global-shaped numpy copy of `x` with the rows this process holds filled in (`fill` elsewhere).

    Only addressable shards are read; on one process this is `np.asarray(x)`.
    """
    if x.is_fully_addressable:
        return np.asarray(x)
    out = np.full(x.shape, fill, dtype=x.dtype)
    for shard in x.addressable_shards:
        out[shard.index] = np.asarray(shard.data)
    return out


def host_to_global(values: np.ndarray, sharding: Sharding) -> jax.Array:
    """A global array of `sharding` from a global-shaped host array valid at least at the rows held here."""
    values = np.asarray(values)
    return jax.make_array_from_callback(values.shape, sharding, lambda index: values[index])


def place_global(tree: Any, shardings: Any) -> Any:
    """`tree` (the same full values on every process) placed with `shardings` (a matching tree, or one
    sharding for every leaf).

    A leaf that lives on this process alone (a host array, or a device array on local devices: optax's
    `count`, a freshly initialised head, an orbax restore onto `jax.local_devices()[0]`) goes through the host
    onto a sharding that spans processes (`host_to_global`, each process supplying its own shards):
    `jax.device_put` refuses a committed local array there, and with ONE device per process (jax 0.10.2) it
    returns an uncommitted one malformed (its local shard is itself a global array: the first
    `addressable_shards`, an orbax save, fails). Leaves already global, or placed on local devices only, go
    through `jax.device_put`.
    """
    def put(x, s):
        if not s.is_fully_addressable and (not isinstance(x, jax.Array) or x.is_fully_addressable):
            return host_to_global(np.asarray(jax.device_get(x)), s)
        return jax.device_put(x, s)

    if isinstance(shardings, Sharding):
        return jax.tree.map(lambda x: put(x, shardings), tree)
    return jax.tree.map(put, tree, shardings)


def gather_owned(values: np.ndarray, owners: np.ndarray) -> np.ndarray:
    """Every process's owned rows combined: row i comes from process `owners[i]`.

    Args:
      values: [N, ...] global-shaped host array, valid at the rows this process owns (anything elsewhere).
      owners: [N] the owner of each row (`row_owners`), the same on every process.
    Returns:
      [N, ...] the same array on every process. One all-gather of the whole array (meant for small per-row
      results: rewards, lengths, flags; never for token arrays).
    """
    values = np.asarray(values)
    if jax.process_count() == 1:
        return values
    stacked = np.asarray(multihost_utils.process_allgather(values, tiled=False))  # [processes, N, ...]
    return stacked[owners, np.arange(values.shape[0])]


def max_across_hosts(value: int) -> int:
    """The largest of one integer per process (e.g. the longest prompt, so every host pads alike)."""
    if jax.process_count() == 1:
        return int(value)
    return int(np.max(multihost_utils.process_allgather(np.asarray(value, np.int64))))


def agree(flag: bool) -> bool:
    """True on every process iff `flag` is True on every process (a branch all hosts must take together)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(np.all(multihost_utils.process_allgather(np.asarray(bool(flag)))))


def to_host(x: Any) -> np.ndarray:
    """The whole value of `x` as numpy on every process (one all-gather when it spans other hosts' devices).

    For arrays every stage needs in full and that are small next to the model: sampled token ids and their
    log-probs, per-row scalars. Host values and fully addressable arrays are returned as they are.
    """
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def sum_across_hosts(x: np.ndarray) -> np.ndarray:
    """The element-wise sum over processes of one small host array (counts)."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x
    return np.asarray(multihost_utils.process_allgather(x, tiled=False)).sum(axis=0)


def gather_json(local: list) -> list:
    """Every process's list of JSON-able items, concatenated in process order (the same list everywhere).

    For small metadata only (a step's prompt records: each host reads and encodes its own block of the
    batch, then all hosts know every row's prompt and answer). Items go through JSON on every process,
    so all hosts hold equal values (tuples become lists).
    """
    if jax.process_count() == 1:
        return list(local)
    data = np.frombuffer(json.dumps(local, separators=(",", ":"), default=_plain).encode(), np.uint8)
    width = max_across_hosts(data.size)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray(data.size, np.int64))).reshape(-1)
    buf = np.zeros((width,), np.uint8)
    buf[: data.size] = data
    stacked = np.asarray(multihost_utils.process_allgather(buf, tiled=False))  # [processes, width]
    return [item for p, n in enumerate(sizes) for item in json.loads(stacked[p, : int(n)].tobytes())]


def _plain(x: Any) -> Any:
    """numpy scalars and arrays as the Python values JSON can hold."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    raise TypeError(f"a prompt record holds a {type(x).__name__}, which cannot be sent to the other hosts")
