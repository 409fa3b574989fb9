"""One-line validation helpers of the config dataclasses (each failure is a `ConfigError` naming the key)."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Iterable

from jaxrl.errors import ConfigError


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raises ConfigError("<key>=<value>: <allowed>") unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {allowed}")


def check_choice(key: str, value: Any, choices: tuple) -> None:
    check(value in choices, key, value, f"allowed values are {', '.join(map(repr, choices))}")


def check_init_params(cls: type, params: Iterable[str], section: str, owner: str) -> inspect.Signature:
    """Raises ConfigError("unknown key '<section>.<key>'; did you mean ...? (valid keys of <owner>: ...)") for
    a key that `cls(tokenizer, **params)` would not accept; returns the constructor's signature."""
    sig = inspect.signature(cls.__init__)
    accepted = [p for p in list(sig.parameters)[2:] if sig.parameters[p].kind in (
        inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return sig
    for key in params:
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
            hint = f"; did you mean '{section}.{close[0]}'?" if close else ""
            raise ConfigError(f"unknown key '{section}.{key}'{hint} (valid keys of {owner}: "
                              f"{', '.join(accepted) or 'none'})")
    return sig
