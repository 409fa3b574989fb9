"""Generic mapping between nested YAML data and frozen config dataclasses: the machinery of `jaxrl.config` and of
`jaxrl train-rm`'s config (`jaxrl.reward_model.config`).

Supported field types: `bool`, `int`, `float`, `str`, `Enum` subclasses, `X | None`, `tuple[X, ...]`,
`dict[str, Any]`, `Any` and nested dataclasses. Every error is a `ConfigError` naming the full dotted key.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import functools
import keyword
import re
import types
import typing
from typing import Any

import yaml

from jaxrl.errors import ConfigError

_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def config_key(field_name: str) -> str:
    """A field's key in the config: its name, except that a Python keyword is spelled with a trailing
    underscore in the dataclass (`train.async` is the field `async_`)."""
    bare = field_name[:-1] if field_name.endswith("_") else field_name
    return bare if keyword.iskeyword(bare) else field_name


def _field_name(key: str) -> str:
    """Inverse of `config_key`."""
    return f"{key}_" if keyword.iskeyword(key) else key


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """Annotations of a dataclass's fields by config key (ClassVars such as `MOVED_KEYS` are not keys)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {config_key(k): v for k, v in typing.get_type_hints(cls).items() if k in names}


def _optional_inner(tp: Any) -> Any | None:
    """X for `X | None`, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


def _type_name(tp: Any) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return f"{_type_name(inner)} or null"
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        return "a list of mappings" if dataclasses.is_dataclass(item) else f"a list of {_type_name(item)}"
    if typing.get_origin(tp) is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    return getattr(tp, "__name__", str(tp))


def _unknown(key: str, name: str, valid: list[str], cls: type | None = None) -> ConfigError:
    full = f"{key}.{name}" if key else name
    moved = getattr(cls, "MOVED_KEYS", {}).get(name)
    if moved is not None:  # a key of an earlier config layout: name its new place
        return ConfigError(f"'{full}' has moved: write '{key + '.' if key else ''}{moved}' instead")
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f"; did you mean '{key + '.' if key else ''}{close[0]}'?" if close else ""
    return ConfigError(
        f"unknown key '{full}'{hint} (valid keys{' of ' + key if key else ''}: {', '.join(valid)})"
    )


def _wrong(key: str, value: Any, tp: Any) -> ConfigError:
    return ConfigError(f"{key}={value!r}: expected {_type_name(tp)}, got {type(value).__name__}")


def convert(value: Any, tp: Any, key: str) -> Any:
    """Checks and converts one YAML value to the field type `tp`; `key` is its full dotted name."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if value is None else convert(value, inner, key)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _wrong(key, value, tp)
        return from_dict(tp, value, key)
    origin = typing.get_origin(tp)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _wrong(key, value, tp)
        (item_tp, *_) = typing.get_args(tp)
        return tuple(convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise _wrong(key, value, tp)
        return copy.deepcopy(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        allowed = [m.value for m in tp]
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: allowed values are {', '.join(map(repr, allowed))}")
        return tp(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise _wrong(key, value, tp)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _wrong(key, value, tp)
        return value
    if tp is float:
        # YAML 1.1 reads "1e-5" (no dot) as a string; accept it rather than surprise users.
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _wrong(key, value, tp)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _wrong(key, value, tp)
        return value
    raise TypeError(f"config field {key} has an unsupported annotation {tp!r}")


_NONE = object()


def _plain(value: Any) -> Any:
    """YAML data with lists as tuples, for comparing a loaded value with a Python default."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def from_dict(cls: type, raw: dict[str, Any], key: str) -> Any:
    """Builds dataclass `cls` from a mapping; bad keys, types or values raise ConfigError."""
    hints = _hints(cls)
    names = [config_key(f.name) for f in dataclasses.fields(cls)]
    kwargs = {}
    retired = getattr(cls, "RETIRED_DEFAULTS", {})
    for name, value in raw.items():
        if name not in hints and _plain(value) == _plain(retired.get(name, _NONE)):
            continue  # a key of an earlier layout at its old default (what that version's dump wrote): no effect
        if name not in hints:
            raise _unknown(key, str(name), names, cls)
        kwargs[_field_name(name)] = convert(value, hints[name], f"{key}.{name}" if key else name)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{key or 'config'}: missing required key(s) {', '.join(missing)}")
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Plain YAML-able data (dicts, lists, scalars) of a config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {config_key(f.name): to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (tuple, list)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _list_index(node: list, part: str, key: str) -> int:
    if part.isdigit() and int(part) < len(node):
        return int(part)
    names = [item.get("name") for item in node if isinstance(item, dict)]
    if part in names:
        return names.index(part)
    raise ConfigError(
        f"--set {key}: no list entry '{part}' (use an index below {len(node)} or one of the "
        f"names {', '.join(map(str, names))})"
    )


def apply_override(cls: type, raw: dict[str, Any], item: str) -> dict[str, Any]:
    """Returns a copy of `raw` with one `a.b.c=value` override applied (value parsed by yaml.safe_load).

    Keys are checked against the dataclass fields while walking the path; below a `dict[str, Any]` field any
    key is accepted (e.g. `model.overrides.num_layers=2`); list entries (rewards) are addressed by index or
    name.
    """
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, for example optimizer.lr=1e-5")
    key, text = (s.strip() for s in item.split("=", 1))
    try:
        value = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {key}: cannot parse the value {text!r} as YAML") from None
    raw = copy.deepcopy(raw)
    parts = key.split(".")
    node: Any = raw
    tp: Any = cls
    for i, part in enumerate(parts):
        done = ".".join(parts[:i])
        tp = _optional_inner(tp) or tp
        if dataclasses.is_dataclass(tp):
            hints = _hints(tp)
            if part not in hints:
                raise _unknown(done, part, list(hints), tp)
            child_tp = hints[part]
        elif typing.get_origin(tp) is dict or tp is Any:
            child_tp = Any
        elif typing.get_origin(tp) is tuple and isinstance(node, list):
            part = _list_index(node, part, key)
            child_tp = typing.get_args(tp)[0]
        else:
            raise ConfigError(f"--set {key}: '{done}' is {_type_name(tp)} and has no sub-key '{part}'")
        if i == len(parts) - 1:
            node[part] = value
            break
        child = node[part] if isinstance(node, list) else node.get(part)
        if child is None:
            child = {}
            node[part] = child
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"--set {key}: '{'.'.join(parts[: i + 1])}' holds {child!r}, not a mapping")
        node, tp = child, child_tp
    return raw


def yaml_error_message(where: str, error: yaml.YAMLError) -> str:
    """`FILE:LINE:COLUMN: invalid YAML: PROBLEM (CONTEXT at ...)`, lines and columns counted from 1."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    if context and context_mark is not None and context_mark is not mark:
        problem += f" ({context} at line {context_mark.line + 1}, column {context_mark.column + 1})"
    elif context:
        problem += f" ({context})"
    if mark is None:
        return f"{where}: invalid YAML: {problem}"
    return f"{where}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {problem}"


def load_yaml_config(cls: type, path, overrides, default_name: str) -> Any:
    """`cls` from a YAML file (or the packaged `jaxrl.configs/<default_name>` when `path` is None) plus dotted
    `key=value` overrides; every problem is one `ConfigError` naming the file or the full dotted key."""
    import importlib.resources
    from pathlib import Path

    if path is None:
        text = importlib.resources.files("jaxrl.configs").joinpath(default_name).read_text()
        where = f"<embedded {default_name}>"
    else:
        try:
            text, where = Path(path).read_text(), str(path)
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_error_message(where, e)) from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of sections, got {type(raw).__name__}")
    for item in overrides:
        raw = apply_override(cls, raw, item)
    return from_dict(cls, raw, "")


def dump_yaml_config(cfg: Any) -> str:
    """The resolved config as YAML (loads back to an equal config)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False, width=110)
