"""Importing user code named as "package.module:function" (reward functions, pairwise judges).

`function:` rewards import and run user code: the module is imported (running its top-level code) when the
rewards are resolved at setup, and the function is called on every batch of completions.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from jaxrl.errors import ConfigError


def import_function(ref: str, where: str) -> Callable[..., Any]:
    """The callable named by `ref` ("package.module:function"); ConfigError naming `where` otherwise.

    Args:
      ref: "package.module:function".
      where: the config location for the error message, e.g. "rewards[answer].function".

    Returns:
      The imported callable.
    """
    module_name, sep, attr = str(ref).partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where}={ref!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 -- user module: ImportError, SyntaxError or its own top-level error
        raise ConfigError(
            f"{where}={ref!r}: cannot import module {module_name!r} ({type(e).__name__}: {e})"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{where}={ref!r}: module {module_name!r} has no function {attr!r}")
    return fn
