"""User-facing errors: bad input that the CLI reports in one line with exit code 2 (never a traceback)."""


class UserError(Exception):
    """Bad input from the user: a config key, a path, a tensor shape.

    The message says what was wrong, where, and what is allowed."""


class ConfigError(UserError):
    """An invalid configuration value or key."""


class CheckpointError(UserError):
    """A missing, malformed or incompatible checkpoint or weights file."""
