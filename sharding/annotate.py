"""The only wrappers over flax/jax sharding metadata.

Flax's metadata keywords keep changing (`sharding`, `sharding_names`, `out_sharding`, ...); every parameter and
every activation constraint in jaxrl goes through these helpers so that a flax upgrade touches one file.

* `param(value, names)` builds an `nnx.Param` carrying logical axis names (one per dimension) without placing it
  on any mesh (`eager_sharding=False`): placement happens later from a rule table (`jaxrl.sharding.rules`).
* `logical_names(variable)` reads them back.
* `Constrain` is the type of an activation-constraint callback `(x, names) -> x`. Models take one as an explicit
  constructor argument (default `no_constraint`), so no mesh or rule table is hidden in global state.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
from flax import nnx

LogicalNames = tuple[Optional[str], ...]
Constrain = Callable[[jax.Array, LogicalNames], jax.Array]


def param(value: jax.Array, names: Sequence[Optional[str]]) -> nnx.Param:
    """An `nnx.Param` holding `value`, annotated with one logical axis name per dimension."""
    names = tuple(names)
    if len(names) != value.ndim:
        raise ValueError(f"param of shape {value.shape} needs {value.ndim} logical names, got {names}")
    return nnx.Param(value, sharding_names=names, eager_sharding=False)


def logical_names(variable: nnx.Variable) -> LogicalNames | None:
    """The logical axis names a variable was annotated with, or None."""
    meta = variable.get_metadata()
    names = meta.get("out_sharding", meta.get("sharding_names"))
    return tuple(names) if names is not None else None


def no_constraint(x: jax.Array, names: LogicalNames) -> jax.Array:
    """The identity `Constrain`: used on a single device and in tests."""
    del names
    return x
