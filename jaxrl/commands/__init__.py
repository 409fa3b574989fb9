"""Subcommands of the `jaxrl` CLI: each module exposes `add_arguments(parser)` and `run(args) -> int`."""
