"""`ENVS` and `make_env`: environments named in a config (`env: {name, params}`), validated up front.

`name` is a built-in key of `ENVS`, "package.module:Class" (importable), or "path/to/file.py:Class" (a user's
environment in one file of their own). The class is constructed as `Class(tokenizer, **params)` once per
episode; `make_env` checks the params against the constructor's signature before any rollout, and, given a
tokenizer, builds one instance so that bad values fail at setup (ConfigError, one line).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Mapping

from jaxrl._checks import check_init_params
from jaxrl._imports import import_attr
from jaxrl.envs.adapters_gym import GymTextEnv
from jaxrl.envs.adapters_skyrl import SkyRLTextEnv
from jaxrl.envs.adapters_trl import TRLToolEnv
from jaxrl.envs.base import Env
from jaxrl.envs.fields import FieldsEnv
from jaxrl.envs.search import SearchEnv, ToolEnv
from jaxrl.envs.tools import ToolError
from jaxrl.errors import ConfigError

ENVS: dict[str, type] = {"search": SearchEnv, "tools": ToolEnv, "fields": FieldsEnv,
                         "gym": GymTextEnv, "skyrl": SkyRLTextEnv, "trl": TRLToolEnv}  # adapters.py


class EnvFactory:
    """`factory(tokenizer) -> Env`: a validated environment class with its params bound. `checked`: whether
    `jaxrl.envs.contract.dry_run` has played one record through it (the first rollout does)."""

    def __init__(self, cls: type, params: Mapping[str, Any], name: str):
        self.cls, self.params, self.name = cls, dict(params), name
        self.checked = False

    def __call__(self, tokenizer) -> Env:
        return self.cls(tokenizer, **self.params)

    def __repr__(self) -> str:
        return f"EnvFactory({self.name!r}, {self.params!r})"


def _import_class(ref: str) -> type:
    return import_attr(ref, "env.name", kind="class", accept=lambda obj: isinstance(obj, type))


def make_env(name: str, params: Mapping[str, Any] | None = None, tokenizer=None) -> EnvFactory:
    """Resolves and validates an environment; returns `EnvFactory` (call it with the tokenizer).

    Args:
      name: a key of `ENVS`, "package.module:Class" or "path/file.py:Class".
      params: constructor keyword arguments (the YAML `env.params`).
      tokenizer: optional; when given, one instance is built now so that invalid values raise ConfigError.

    Returns:
      EnvFactory.
    """
    params = dict(params or {})
    if ":" in str(name):
        cls = _import_class(str(name))
    elif name in ENVS:
        cls = ENVS[name]
    else:
        close = difflib.get_close_matches(str(name), list(ENVS), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"env.name={name!r}: unknown environment{hint} (built-in: {', '.join(ENVS)}; "
                          f"or 'package.module:Class' / 'path/file.py:Class')")
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigError(
            f"env.name={name!r}: {cls.__name__} lacks {', '.join(missing)} (see jaxrl.envs.Env)")
    sig = check_init_params(cls, params, "env.params", f"env {name!r}")
    required = [p for p in list(sig.parameters)[2:] if sig.parameters[p].default is inspect.Parameter.empty
                and sig.parameters[p].kind in (inspect.Parameter.KEYWORD_ONLY,
                                               inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    absent = [p for p in required if p not in params]
    if absent:
        raise ConfigError(f"env {name!r} needs env.params.{absent[0]} (required: {', '.join(required)})")
    factory = EnvFactory(cls, params, str(name))
    if tokenizer is not None:
        try:
            env = factory(tokenizer)
        except (ValueError, TypeError, ToolError) as e:  # ToolError: a tool's own parameter (top_k)
            raise ConfigError(f"env {name!r} with params {params}: {e}") from None
        if not isinstance(getattr(env, "stop_strings", None), tuple):
            raise ConfigError(f"env {name!r}: {cls.__name__}.stop_strings must be a tuple of strings")
    return factory
