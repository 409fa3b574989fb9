"""Resolving reward specs once, at setup: `resolve(specs) -> Rewards`, checked before any model is built.

Every reward function is called as `fn(prompts, completions, **params, **fields)`: `params` are the spec's
`params:` (bound once here), `fields` the per-sample lists the rollout passes (dataset columns and
`completion_length`). `resolve` raises a one-line `ConfigError` for an unknown `type`, an unimportable
`function:` module or a missing function, a param the function does not declare (with a did-you-mean), a
missing required param, a param of the wrong scalar type (`int`/`float`/`bool`/`str` annotations) and a bad
built-in param value. A param must be a named parameter of the function even when it also takes `**kwargs`
(those receive the per-sample fields only), so a misspelt param never passes silently.

`function:` rewards import and run user code: the module is imported here, the function runs on every batch.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import types
import typing
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from jaxrl.errors import ConfigError
from jaxrl.rewards.imports import import_function
from jaxrl.rewards.registry import BUILTINS

_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclasses.dataclass(frozen=True)
class Reward:
    """One resolved reward.

    name, weight, on_error: from the spec. fn: the function with its params bound. params: the validated
    params as given. fields: the per-sample fields the function takes (None: all of them, it has `**kwargs`).
    required_fields: the fields it cannot run without.
    """

    name: str
    fn: Callable[..., Sequence[Any]]
    weight: float
    on_error: str
    params: Mapping[str, Any]
    fields: frozenset[str] | None
    required_fields: frozenset[str]

    def select(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The subset of the per-sample `fields` this reward is called with (never one of its params)."""
        wanted = fields.keys() if self.fields is None else self.fields
        return {k: fields[k] for k in wanted if k in fields and k not in self.params}


@dataclasses.dataclass(frozen=True)
class Rewards:
    """K resolved rewards, in spec order; built once by `resolve` and passed to every `score` call."""

    rewards: tuple[Reward, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rewards)

    @property
    def weights_R(self) -> np.ndarray:
        """float32 [R] reward weights."""
        return np.asarray([r.weight for r in self.rewards], np.float32).reshape(len(self.rewards))

    @property
    def on_error(self) -> tuple[str, ...]:
        return tuple(r.on_error for r in self.rewards)

    def __len__(self) -> int:
        return len(self.rewards)

    def __iter__(self) -> Iterator[Reward]:
        return iter(self.rewards)


def _type_ok(value: Any, annotation: Any) -> bool:
    """Whether `value` fits a scalar annotation (int, float, bool, str, None and unions of them); any other
    annotation is not checked."""
    is_union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    options = typing.get_args(annotation) if is_union else (annotation,)
    if not all(o in (int, float, bool, str, type(None)) for o in options):
        return True
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    return any(
        (o is type(None) and value is None)
        or (o is bool and isinstance(value, (bool, np.bool_)))
        or (o is int and number and isinstance(value, (int, np.integer)))
        or (o is float and number)
        or (o is str and isinstance(value, str))
        for o in options
    )


def _signature(fn: Callable[..., Any], where: str) -> inspect.Signature:
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # noqa: BLE001 -- unresolvable string annotations: check names only, not types
        try:
            return inspect.signature(fn)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: cannot read the function's signature ({e})") from None


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def build_reward(spec: Any, *, fields: Iterable[str] | None = None) -> Reward:
    """Resolves and validates one `jaxrl.config.RewardSpec` (see the module docstring).

    Args:
      spec: a RewardSpec (name, type, function, params, weight, on_error).
      fields: the names of the per-sample fields the rollout will pass (dataset fields and
        `completion_length`), when known: a required field missing from them is then an error here.

    Returns:
      The resolved `Reward`.
    """
    where = f"rewards[{spec.name}]"
    if spec.type == "function":
        fn, builtin, what = import_function(spec.function, f"{where}.function"), None, repr(spec.function)
    elif spec.type in BUILTINS:
        builtin = BUILTINS[spec.type]
        fn, what = builtin.fn, f"the {spec.type!r} reward"
    else:
        allowed = ", ".join(map(repr, [*BUILTINS, "function"]))
        raise ConfigError(f"{where}.type={spec.type!r}: allowed values are {allowed}")
    sig = _signature(fn, f"{where}.function={spec.function!r}")
    ps = list(sig.parameters.values())
    n_pos = sum(p.kind in _POSITIONAL for p in ps)
    if n_pos < 2 and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in ps):
        raise ConfigError(f"{where}: {what} must take (prompts, completions, **fields) positionally")
    named = {p.name: p for p in ps[min(n_pos, 2):] if p.kind in _KEYWORD}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ps)
    params = dict(spec.params or {})
    field_names = set(builtin.fields) if builtin else set()
    allowed = [k for k in named if k not in field_names]
    for key, value in params.items():
        if key in field_names:
            raise ConfigError(f"{where}.params.{key}: is a per-sample field of {what}, read from the data; "
                              f"params allowed: {', '.join(allowed) or 'none'}")
        if key not in named:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{where}.params.{key}: unknown param of {what}; {hint}"
                              f"params allowed: {', '.join(allowed) or 'none'}")
        annotation = named[key].annotation
        if annotation is not inspect.Parameter.empty and not isinstance(annotation, str) \
                and not _type_ok(value, annotation):
            raise ConfigError(f"{where}.params.{key}={value!r}: must be {_type_name(annotation)}")
    required = {k for k, p in named.items() if p.default is inspect.Parameter.empty and k not in params}
    if builtin:
        missing = sorted(required - field_names)
        if missing:
            raise ConfigError(f"{where}.params.{missing[0]}: required by {what} and not given "
                              f"(params allowed: {', '.join(allowed)})")
    available = None if fields is None else set(fields)
    if available is not None:
        missing = sorted(required - available)
        if missing:
            have = f"the data has the fields {', '.join(sorted(available)) or 'none'}"
            if builtin:
                raise ConfigError(f"{where}: {what} needs the per-sample field {missing[0]!r}; {have}")
            raise ConfigError(f"{where}.params.{missing[0]}: {what} needs this param (or per-sample field); "
                              f"{have}")
    if builtin and builtin.check:
        defaults = {k: p.default for k, p in named.items() if p.default is not inspect.Parameter.empty}
        try:
            builtin.check({**defaults, **params})
        except (ValueError, TypeError, ConfigError) as e:
            raise ConfigError(f"{where}.{e}") from None
    weight = float(spec.weight)
    if not math.isfinite(weight):
        raise ConfigError(f"{where}.weight={spec.weight!r}: must be a finite number")
    if builtin:
        takes = frozenset(field_names)
    else:
        takes = None if var_kw else frozenset(k for k in named if k not in params)
    bound = functools.partial(fn, **params) if params else fn
    return Reward(spec.name, bound, weight, spec.on_error, types.MappingProxyType(params), takes,
                  frozenset(required & (field_names if builtin else required)))


def resolve(specs: Sequence[Any] | Rewards, *, fields: Iterable[str] | None = None) -> Rewards:
    """Resolves R reward specs once (at setup, before any model is built); see the module docstring.

    Args:
      specs: K `jaxrl.config.RewardSpec`s (already resolved `Reward`s pass through; a `Rewards` is returned).
      fields: optional names of the per-sample fields the rollout will pass (dataset record keys plus
        `completion_length`); when given, a reward needing a field that is not there fails here.

    Returns:
      The frozen `Rewards`; ConfigError (one line naming `rewards[<name>]...`) on any invalid spec.
    """
    if isinstance(specs, Rewards):
        return specs
    fields = None if fields is None else tuple(fields)
    built = tuple(s if isinstance(s, Reward) else build_reward(s, fields=fields) for s in specs)
    seen: set[str] = set()
    for r in built:
        if r.name in seen:
            raise ConfigError(f"rewards[{r.name}]: reward names must be unique")
        seen.add(r.name)
    return Rewards(built)
