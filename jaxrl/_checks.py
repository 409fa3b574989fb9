"""One-line validation helpers of the config dataclasses (each failure is a `ConfigError` naming the key)."""

from __future__ import annotations

from typing import Any

from jaxrl.errors import ConfigError


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raises ConfigError("<key>=<value>: <allowed>") unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {allowed}")


def check_choice(key: str, value: Any, choices: tuple) -> None:
    check(value in choices, key, value, f"allowed values are {', '.join(map(repr, choices))}")
