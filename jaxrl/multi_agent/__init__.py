"""Multi-agent systems played by one shared policy (MARCH; an SSP skeleton): `multi_agent:` in the config.

    multi_agent: {system: march, params: {...}}     -> make_system(name, params, tokenizer)

A system (the `jaxrl.rl.collect.System` protocol) is resolved once in `jaxrl.rl.setup.setup` and becomes the
run's collector (`jaxrl.rl.collect.SystemRows`): its `collect(graphdef, params, records, rewards, spec, key,
train=...)` is the collect stage of the RL step and returns one `jaxrl.types.Rollout` of the trained
roles' rows (`jaxrl.multi_agent.roles`), so the rest of the step (advantages, assemble, update) is unchanged.
`demonstration_env` gives the SFT warm start its role-format demonstrations.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

from jaxrl._checks import check_init_params
from jaxrl._imports import import_attr, is_reference
from jaxrl.errors import ConfigError
from jaxrl.multi_agent.march import MarchSystem
from jaxrl.multi_agent.ssp import SspSystem
from jaxrl.multi_agent.roles import joint_rollout, role_metrics, role_rows, row_roles

SYSTEMS = {"march": MarchSystem, "ssp": SspSystem}


def make_system(name: str, params: Mapping[str, Any] | None, tokenizer):
    """The system `name` (a key of SYSTEMS, or a user class "module:Class") built with `params` (unknown or invalid keys raise ConfigError naming the key)."""
    if is_reference(name):  # a user's system class, "package.module:Class" or "path/file.py:Class"
        cls = import_attr(name, "multi_agent.system", kind="class", accept=lambda obj: isinstance(obj, type))
    elif name not in SYSTEMS:
        close = difflib.get_close_matches(str(name), list(SYSTEMS), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"multi_agent.system={name!r}: unknown system{hint} "
                          f"(built-in: {', '.join(SYSTEMS)}; or a class, 'package.module:Class')")
    else:
        cls = SYSTEMS[name]
    check_init_params(cls, params or {}, "multi_agent.params", repr(name))
    try:
        return cls(tokenizer, **dict(params or {}))
    except ValueError as e:
        raise ConfigError(f"multi_agent.params of {name!r}: {e}") from None


__all__ = ["SYSTEMS", "MarchSystem", "SspSystem", "joint_rollout", "make_system", "role_metrics",
           "role_rows",
           "row_roles"]
