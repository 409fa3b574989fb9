"""User code named in a config: "package.module:attr" or "path/to/file.py:attr", resolved in one place.

Every registry that accepts a user's object resolves it here (environments `env.name`, reward functions and
judges, multi-agent systems `multi_agent.system`, algorithms `algorithm.name`), so each accepts both forms and
fails the same way: one `ConfigError` line naming the config key, the reference and what went wrong. Importing
runs the module's top-level code: only code the user named is imported, never code from a model directory.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from jaxrl.errors import ConfigError


def is_reference(name: str) -> bool:
    """Whether `name` names user code ("module:attr") rather than a registry key."""
    return ":" in str(name)


def import_attr(ref: str, where: str, *, kind: str, accept: Callable[[Any], bool]) -> Any:
    """The object `ref` names, checked by `accept`; a ConfigError "{where}={ref!r}: ..." otherwise.

    Args:
      ref: "package.module:attr", or "path/to/file.py:attr" (a file outside any package).
      where: the config key for the message, e.g. "env.name".
      kind: what `attr` must be, for the message ("class", "function", "Algorithm record").
      accept: the check on the imported object (e.g. `callable`).
    """
    module_name, sep, attr = str(ref).rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where}={ref!r}: expected 'package.module:{kind}' or 'path/file.py:{kind}'")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ConfigError(f"{where}={ref!r}: no file {str(path)!r}")
    try:
        if module_name.endswith(".py"):
            module = _exec_file(Path(module_name))
        else:
            module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 -- user module: ImportError, SyntaxError or its own top-level error
        raise ConfigError(
            f"{where}={ref!r}: cannot import module {module_name!r} ({type(e).__name__}: {e})") from None
    obj = getattr(module, attr, None)
    if obj is None or not accept(obj):
        raise ConfigError(f"{where}={ref!r}: module {module_name!r} has no {kind} {attr!r}")
    return obj


def _exec_file(path: Path):
    """Imports a file outside any package, registered in `sys.modules` under a name unique to its resolved path
    (importlib's recipe: a dataclass in the file looks its module up there), and executed once: a second
    reference to the same file gets the same module, so its classes stay the same objects."""
    resolved = path.resolve()
    name = f"jaxrl_user_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
