"""Logical-axis rule tables: which mesh axes split each logical tensor dimension. Plain data, one place.

Logical names (the only ones jaxrl uses):
`batch, length, embed, mlp, heads, kv_heads, head_dim, vocab, layers`.
Mesh axes: `data, fsdp, tensor` (see `jaxrl.sharding.mesh`).

* `FSDP`: ZeRO-3. Parameters are split along `embed` over `fsdp` (the embedding table [V, D] along `vocab`,
  see below); activations along `batch` over `data` and `fsdp`.
* `FSDP_TP`: the same plus Megatron tensor parallelism: `heads`, `kv_heads`, `mlp` and `vocab` over
  `tensor`.

`logical_to_spec` never uses one mesh axis twice in a spec: a later dimension whose axes are already taken is
left unsplit. So the activation `("batch", "length", "embed")` is split along batch only (batch already holds
`fsdp`), while the weight `("embed", "mlp")` is split along embed — the usual FSDP layout, from one table.

`vocab` is split only where its mesh axes divide the dimension (`DIVISIBLE_ONLY`, when the shape is known);
otherwise its axes stay free for the tensor's later dimensions. So the embedding table `("vocab", "embed")`
is split along V when V divides (every real vocabulary) and along D otherwise (tiny built-in vocabularies),
while the head `("embed", "vocab")` keeps D. Why not D for the table: the lookup's gradient is a scatter-add
of the batch-split cotangent [B, L, D] into the table, and on a data x fsdp mesh GSPMD cannot move that
cotangent onto a D split over fsdp: it replicates it ("Involuntary full rematerialization", an all-gather of
the whole activation every step; tests/sharding/test_compile_hygiene.py). Split along V, the scatter-add is
local and its result is reduce-scattered like any FSDP gradient.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

from jax.sharding import Mesh, PartitionSpec

from jaxrl.errors import ConfigError

MeshAxes = tuple[str, ...]
Rules = Mapping[str, MeshAxes]

LOGICAL_NAMES: tuple[str, ...] = (
    "batch", "length", "embed", "mlp", "heads", "kv_heads", "head_dim", "vocab", "layers",
)

FSDP: Rules = {
    "batch": ("data", "fsdp"),
    "length": (),
    "embed": ("fsdp",),
    "mlp": (),
    "heads": (),
    "kv_heads": (),
    "head_dim": (),
    "vocab": ("fsdp",),
    "layers": (),
}

FSDP_TP: Rules = {
    "batch": ("data", "fsdp"),
    "length": (),
    "embed": ("fsdp",),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "vocab": ("tensor",),
    "layers": (),
}

RULES: dict[str, Rules] = {"fsdp": FSDP, "fsdp_tp": FSDP_TP}
# Logical names that take their mesh axes only where those divide the dimension (see the module docstring).
DIVISIBLE_ONLY: frozenset[str] = frozenset({"vocab"})


def _entry(axes: MeshAxes):
    """PartitionSpec entry for a tuple of mesh axes: None, one name, or a tuple of names."""
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def logical_to_spec(names: Sequence[Optional[str]], rules: Rules, shape: Sequence[int] | None = None,
                    sizes: Mapping[str, int] | None = None) -> PartitionSpec:
    """The PartitionSpec of a tensor whose dimensions carry `names` (None = never split).

    A mesh axis already used by an earlier dimension is dropped from later ones (see the module docstring).
    With the tensor's `shape` and the mesh axis `sizes`, a `DIVISIBLE_ONLY` dimension keeps only the longest
    prefix of its axes that divides it. Raises ValueError for a name the table does not know.
    """
    used: set[str] = set()
    entries = []
    for dim, name in enumerate(names):
        if name is None:
            entries.append(None)
            continue
        if name not in rules:
            raise ValueError(f"unknown logical axis name {name!r}; the rule table knows {sorted(rules)}")
        axes = tuple(a for a in rules[name] if a not in used)
        if name in DIVISIBLE_ONLY and shape is not None and sizes is not None:
            while axes and shape[dim] % math.prod(sizes[a] for a in axes):
                axes = axes[:-1]
        used.update(axes)
        entries.append(_entry(axes))
    return PartitionSpec(*entries)


def spec_axes(entry) -> MeshAxes:
    """The mesh axes of one PartitionSpec entry, as a tuple."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def check_divisible(
    shape: Sequence[int], spec: PartitionSpec, mesh: Mesh | Mapping[str, int], *, what: str
) -> None:
    """Raise ConfigError naming `what`, the dimension, its size and the mesh axes if a split is uneven.

    `mesh` may be a Mesh or just its axis sizes (`{"data": 1, "fsdp": 64, "tensor": 1}`), as `jaxrl plan` has
    no real devices.
    """
    sizes = mesh.shape if isinstance(mesh, Mesh) else mesh
    for dim, (size, entry) in enumerate(zip(shape, spec)):
        axes = spec_axes(entry)
        ways = math.prod(sizes[a] for a in axes)
        if size % ways:
            axes_desc = " x ".join(f"{a}={sizes[a]}" for a in axes)
            raise ConfigError(
                f"{what}: dimension {dim} of shape {tuple(shape)} has size {size}, which is not divisible by "
                f"mesh axis {axes_desc} ({ways} ways); change the mesh sizes or the rules"
            )
