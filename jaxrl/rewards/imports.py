"""Importing user code named as "package.module:function" (reward functions, pairwise judges).

`function:` rewards import and run user code: the module is imported (running its top-level code) when the
rewards are resolved at setup, and the function is called on every batch of completions.
"""

from __future__ import annotations

from typing import Any, Callable

from jaxrl._imports import import_attr


def import_function(ref: str, where: str) -> Callable[..., Any]:
    """The callable named by `ref` ("package.module:function"); `jaxrl.errors.ConfigError` naming `where`
    otherwise (`jaxrl._imports.import_attr`).

    Args:
      ref: "package.module:function" or "path/file.py:function".
      where: the config location for the error message, e.g. "rewards[answer].function".

    Returns:
      The imported callable.
    """
    return import_attr(ref, where, kind="function", accept=callable)
