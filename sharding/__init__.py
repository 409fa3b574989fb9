"""jaxrl.sharding: meshes, logical-axis rules and annotation helpers."""
from jaxrl.sharding.annotate import Constrain, LogicalNames, logical_names, no_constraint, param
from jaxrl.sharding.mesh import AXES, MeshConfig, make_mesh
from jaxrl.sharding.rules import FSDP, FSDP_TP, LOGICAL_NAMES, RULES, Rules, check_divisible, logical_to_spec

__all__ = [
    "AXES", "Constrain", "FSDP", "FSDP_TP", "LOGICAL_NAMES", "LogicalNames", "MeshConfig", "RULES", "Rules",
    "check_divisible", "logical_names", "logical_to_spec", "make_mesh", "no_constraint", "param",
]
