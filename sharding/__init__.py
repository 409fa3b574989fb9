"""jaxrl.sharding: meshes, logical-axis rules and annotation helpers."""
from jaxrl.sharding.annotate import Constrain, LogicalNames, logical_names, no_constraint, param

__all__ = ["Constrain", "LogicalNames", "logical_names", "no_constraint", "param"]
