"""The `dayzero` subcommands, one module each.

Each module has `add_parser(subparsers)`, which declares its arguments and sets `handler`. Adding
a command is a new module plus one entry in `COMMANDS`.
"""

from . import align, backends, bench, compile, coverage, generate, inspect, run, serve

COMMANDS = (compile, run, generate, serve, inspect, coverage, align, bench, backends)
