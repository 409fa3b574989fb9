"""No config key without a reader (issue 26 item 6).

A key the schema accepts and nothing reads is worse than an unknown key: the user's setting is silently
ignored (`logging.wandb` and `logging.every` once were). This walks the whole `ExperimentConfig` schema, every
nested section included, and requires each field's name to be read outside the config modules themselves
(their `__post_init__` checks do not count: validating a value is not using it): as an attribute load
(`cfg.rollout.group_size`) or a string constant (`getattr(section, "name")`, a `to_dict` key). A generic
name (`every`, `name`) is satisfied by any reader of that name, so the check is necessary, not sufficient:
each key's effect is asserted by the tests of its feature. A distinct name that nobody reads fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from jaxrl.config import ExperimentConfig

ROOT = Path(__file__).resolve().parents[2]
READERS = ("jaxrl", "models", "losses", "sharding")
CONFIG_MODULES = {f"jaxrl/config/{m}.py" for m in ("__init__", "io", "model", "sources", "algorithm", "training", "experiment")}


def schema_keys(cls, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, field name) of every field of dataclass `cls` and of the dataclasses its fields hold
    (directly, optional, or in a tuple/list/dict)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        out.append((key, f.name))
        stack, seen = [hints[f.name]], set()
        while stack:
            t = stack.pop()
            if dataclasses.is_dataclass(t) and t not in seen:
                seen.add(t)
                out += schema_keys(t, key + ".")
            stack += typing.get_args(t)
    return out


def names_read(sources: list[str]) -> set[str]:
    """Attribute names loaded and string constants in `sources` (Python texts)."""
    names = set()
    for text in sources:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)
    return names


def unread_keys(cls, sources: list[str]) -> list[str]:
    read = names_read(sources)
    return [key for key, name in schema_keys(cls) if name not in read]


def _library_sources() -> list[str]:
    return [p.read_text() for d in READERS for p in sorted((ROOT / d).rglob("*.py"))
            if p.relative_to(ROOT).as_posix() not in CONFIG_MODULES]


def test_every_config_key_is_read_outside_the_config_modules():
    keys = schema_keys(ExperimentConfig)
    assert len(keys) > 150, "the walk reaches the nested sections"
    for nested in ("rollout.group_size", "algorithm.clip.low", "logging.wandb.project", "rewards.params",
                   "env.max_turns", "multi_agent.system", "model.lora.rank", "mesh.fsdp"):
        assert nested in {k for k, _ in keys}, nested
    assert unread_keys(ExperimentConfig, _library_sources()) == []


@dataclasses.dataclass(frozen=True)
class _Inner:
    used_knob: int = 1
    forgotten_knob: int = 2


@dataclasses.dataclass(frozen=True)
class _Outer:
    inner: _Inner | None = None
    items: tuple[_Inner, ...] = ()


def test_a_key_nobody_reads_is_reported_with_its_dotted_path():
    reader = "def f(cfg):\n    return cfg.inner.used_knob, [i for i in cfg.items]\n"
    assert unread_keys(_Outer, [reader]) == ["inner.forgotten_knob", "items.forgotten_knob"]
    # an assignment is not a read; a string key is
    assert unread_keys(_Outer, ["x.forgotten_knob = 1\n" + reader]) == ["inner.forgotten_knob",
                                                                        "items.forgotten_knob"]
    assert unread_keys(_Outer, ["d['forgotten_knob']\n" + reader]) == []
