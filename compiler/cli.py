"""The `dayzero` command line (shared/DESIGN.md, "Command line").

Exit status: 0 success; 1 a user-facing error, printed as one message without a traceback
(unless --debug); 2 bad command-line usage (argparse's own convention).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from .commands import COMMANDS
from .errors import DayzeroError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dayzero", description="Compile PyTorch models to "
                                     "self-contained artifacts and run them.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) or 0
    except DayzeroError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"error: {exc.message()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an internal bug: say so, keep the traceback behind --debug
        if args.debug:
            traceback.print_exc()
        print(f"internal error: {type(exc).__name__}: {exc}\n  fix: rerun with --debug and "
              "report the traceback", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
