"""Placement: NamedShardings for parameters, optimizer state, KV caches, batches and activations.

Everything here is derived from one rule table (`jaxrl.sharding.rules`) and the logical names each parameter
carries (`jaxrl.sharding.param`). Works on concrete and on abstract (`nnx.eval_shape`) states, so the same
shardings serve `jax.jit(in_shardings=..., out_shardings=...)`, orbax restore targets and `jaxrl plan`.

* Variables with logical names get `logical_to_spec(names)`; the split is checked for divisibility and a bad
  one names the tensor path, the dimension, its size and the mesh axes.
* Subtrees with the same tree structure as `params` (optax moments `mu`/`nu` built from plain arrays) mirror
  the parameter shardings.
* Everything else (step counters, unnamed leaves) is replicated.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl.sharding.annotate import Constrain, LogicalNames, logical_names
from jaxrl.sharding.rules import Rules, check_divisible, logical_to_spec, spec_axes

# Logical names of the KV-cache fields (`jaxrl.models.KVCache`): k, v are [Y, B, S, K, H].
KV_CACHE_NAMES: dict[str, LogicalNames] = {
    "k": ("layers", "batch", "kv_heads", "length", "head_dim"),
    "v": ("layers", "batch", "kv_heads", "length", "head_dim"),
    "valid_BS": ("batch", "length"),
    "index": (),
}


def path_str(path) -> str:
    """`layers.self_attn.q_proj.kernel` from a jax key path."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts) or "<root>"


def named_sharding(
    shape: tuple[int, ...], names: LogicalNames, mesh: Mesh, rules: Rules, *, what: str
) -> NamedSharding:
    """The NamedSharding of one tensor of `shape` with logical `names`, checked for divisibility."""
    if len(names) != len(shape):
        raise ValueError(f"{what}: {len(names)} logical names {names} for a tensor of shape {shape}")
    spec = logical_to_spec(names, rules, shape, mesh.shape)
    check_divisible(shape, spec, mesh, what=what)
    return NamedSharding(mesh, spec)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def _leaf_paths(tree) -> list[str]:
    return [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_variable)[0]]


def _unwrap(x):
    return x.get_value() if _is_variable(x) else x


def state_shardings(tree: Any, mesh: Mesh, rules: Rules, *, params: Any = None) -> Any:
    """A pytree of NamedSharding matching `tree` (a model state, an optax state, or any mix).

    Args:
      tree: pytree of `nnx.Variable`s and/or arrays (concrete or `jax.ShapeDtypeStruct`).
      mesh: the device mesh.
      rules: a rule table (`FSDP` or `FSDP_TP`).
      params: optional annotated parameter state; subtrees of `tree` with the same leaf paths (optimizer
        moments stored as plain arrays, e.g. built from `nnx.to_pure_dict(params)`) take its shardings.
    Returns:
      `tree` with every array replaced by its NamedSharding (Variables keep their type and metadata and hold
      the sharding as value), usable as `in_shardings`/`out_shardings` and with `jax.device_put`.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    by_path: dict[str, NamedSharding] = {}
    if params is not None:
        param_shardings = state_shardings(params, mesh, rules)
        flat, _ = jax.tree_util.tree_flatten_with_path(param_shardings, is_leaf=_is_variable)
        by_path = {path_str(p): _unwrap(s) for p, s in flat}

    def _mirror(path, x):
        sharding = by_path[path_str(path)]
        return x.replace(value=sharding) if _is_variable(x) else sharding

    def mirrors_params(x) -> bool:
        return bool(by_path) and not _is_variable(x) and _leaf_paths(x) == list(by_path)

    def leaf(path, x):
        if mirrors_params(x):
            return jax.tree_util.tree_map_with_path(_mirror, x, is_leaf=_is_variable)
        if not _is_variable(x):
            return replicated
        names = logical_names(x)
        if names is None:
            return x.replace(value=replicated)
        shape = tuple(_unwrap(x).shape)
        return x.replace(value=named_sharding(shape, names, mesh, rules, what=path_str(path)))

    is_leaf = lambda x: _is_variable(x) or mirrors_params(x)  # noqa: E731
    return jax.tree_util.tree_map_with_path(leaf, tree, is_leaf=is_leaf)


def kv_cache_shardings(cache: Any, mesh: Mesh, rules: Rules) -> Any:
    """Shardings of a KV cache pytree by field name (`KV_CACHE_NAMES`): batch over data+fsdp, kv_heads over
    tensor (with FSDP_TP), layers/slots/head_dim whole."""

    def leaf(path, x):
        field = path_str(path[-1:])
        if field not in KV_CACHE_NAMES:
            known = list(KV_CACHE_NAMES)
            raise ValueError(f"KV cache field {path_str(path)!r} has no logical names; known: {known}")
        return named_sharding(tuple(x.shape), KV_CACHE_NAMES[field], mesh, rules, what=f"kv_cache.{field}")

    return jax.tree_util.tree_map_with_path(leaf, cache)


def batch_shardings(tree: Any, mesh: Mesh, rules: Rules) -> Any:
    """Shardings of a batch pytree: the leading dimension of every array is `batch`, the rest whole."""

    def leaf(path, x):
        names = ("batch",) + (None,) * (len(x.shape) - 1) if len(x.shape) else ()
        return named_sharding(tuple(x.shape), names, mesh, rules, what=f"batch.{path_str(path)}")

    return jax.tree_util.tree_map_with_path(leaf, tree)


def global_batch(local: Any, mesh: Mesh, rules: Rules) -> Any:
    """Assemble a global batch from each process's rows (multi-host data loading).

    Every process loads only its own `1/process_count` of the rows (contiguous, in process order) and calls
    this with them; the result is one global array per leaf, split like `batch_shardings`. On one process it
    is a plain `device_put`.
    """

    def leaf(x):
        names = ("batch",) + (None,) * (x.ndim - 1) if x.ndim else ()
        return jax.make_array_from_process_local_data(NamedSharding(mesh, logical_to_spec(names, rules)), x)

    return jax.tree.map(leaf, local)


def _fit_spec(shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh) -> PartitionSpec:
    """Each entry cut to the longest prefix of its mesh axes whose product divides the dimension."""
    entries = []
    for size, entry in zip(shape, spec):
        axes = spec_axes(entry)
        while axes and size % math.prod(mesh.shape[a] for a in axes):
            axes = axes[:-1]
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries)


def row_sharding(mesh: Mesh, rules: Rules, rows: int) -> NamedSharding:
    """The layout of arrays of any rank whose leading axis is `rows` batch rows (the other axes whole): the
    rows split like a `batch` activation under `make_constrain` (the longest prefix of the batch axes that
    divides `rows`). Host-driven stages (multi-turn episodes) use it to know which rows each host holds
    before the jitted call that `make_constrain` pins to the same layout."""
    return NamedSharding(mesh, _fit_spec((int(rows),), logical_to_spec(("batch",), rules), mesh))


def make_constrain(mesh: Mesh, rules: Rules, *, strict: bool = False) -> Constrain:
    """A `Constrain` callback: `with_sharding_constraint` of an activation from its logical names.

    Models call it at block boundaries only (embeddings out, each block out, logits), e.g.
    `constrain(hidden_BLD, ("batch", "length", "embed"))`. Activation layouts are hints: a dimension that its
    axes do not divide (a prefill of 4 prompts on 8 batch shards) is split over the longest prefix of those
    axes that divides it, so any batch size runs. `strict=True` raises instead (tests, debugging).
    """

    def constrain(x: jax.Array, names: LogicalNames) -> jax.Array:
        names, shape = tuple(names), tuple(x.shape)
        if strict:
            sharding = named_sharding(shape, names, mesh, rules, what=f"activation {names}")
        else:
            if len(names) != len(shape):
                raise ValueError(f"activation: {len(names)} logical names {names} for shape {shape}")
            sharding = NamedSharding(mesh, _fit_spec(shape, logical_to_spec(names, rules), mesh))
        return jax.lax.with_sharding_constraint(x, sharding)

    return constrain


def abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying shardings (orbax restore targets); shardings from `state_shardings`."""

    def attach(x, s):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

    return jax.tree.map(attach, abstract, shardings)
