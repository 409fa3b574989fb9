"""jaxrl.sharding: meshes, logical-axis rules, placement and annotation helpers."""
from jaxrl.sharding.annotate import Constrain, LogicalNames, logical_names, no_constraint, param
from jaxrl.sharding.mesh import AXES, MeshConfig, make_mesh
from jaxrl.sharding.place import (
    KV_CACHE_NAMES,
    abstract_with_shardings,
    batch_shardings,
    global_batch,
    kv_cache_shardings,
    make_constrain,
    named_sharding,
    row_sharding,
    state_shardings,
)
from jaxrl.sharding.rules import FSDP, FSDP_TP, LOGICAL_NAMES, RULES, Rules, check_divisible, logical_to_spec

__all__ = [
    "AXES", "Constrain", "FSDP", "FSDP_TP", "KV_CACHE_NAMES", "LOGICAL_NAMES", "LogicalNames", "MeshConfig",
    "RULES", "Rules", "abstract_with_shardings", "batch_shardings", "check_divisible", "global_batch",
    "kv_cache_shardings", "logical_names", "logical_to_spec", "make_constrain", "make_mesh", "named_sharding",
    "no_constraint", "param", "row_sharding", "state_shardings",
]
