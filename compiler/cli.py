"""The `dayzero` command line (shared/DESIGN.md, "Command line").

Exit status: 0 success; 1 a user-facing error, printed as one message without a traceback
(unless --debug); 2 bad command-line usage (argparse's own convention); 141 (128 + SIGPIPE, as
other command-line tools) when the reader of the output went away (`dayzero inspect m.dz | head`).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from .commands import COMMANDS
from .errors import DayzeroError

SIGPIPE_EXIT = 141


def version() -> str:
    """The installed package's version (the one artifacts record as producer_version); from a
    source tree that is not installed, the version its pyproject.toml declares."""
    import importlib.metadata
    import re
    from pathlib import Path

    try:
        return importlib.metadata.version("dayzero")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    except OSError:
        return "unknown"
    found = re.search(r'^\[project\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.M | re.S)
    return f"{found.group(1)} (source tree, not installed)" if found else "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dayzero", description="Compile PyTorch models to "
                                     "self-contained artifacts and run them.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"dayzero {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for command in COMMANDS:
        command.add_parser(sub)
    for command_parser in sub.choices.values():
        # `dayzero run m.dz --debug` as well as `dayzero --debug run m.dz`; SUPPRESS keeps the
        # top-level value when the subcommand does not repeat it
        command_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                    help="show tracebacks on errors")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.handler(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError as exc:
        if _stdout_closed():
            return _reader_went_away()
        return _internal_error(exc, args.debug)  # another pipe or socket: a real failure
    except DayzeroError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"error: {exc.message()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an internal bug: say so, keep the traceback behind --debug
        return _internal_error(exc, args.debug)


def _internal_error(exc: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"internal error: {type(exc).__name__}: {exc}\n  fix: rerun with --debug and "
          "report the traceback", file=sys.stderr)
    return 1


def _stdout_closed() -> bool:
    """Whether the BrokenPipeError is stdout's: its pipe reports that the reader is gone."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real stdout (captured): cannot tell
        return True


def _reader_went_away() -> int:
    """Output into a closed pipe: stop quietly, as `cat` does. What is still buffered goes to
    /dev/null so that the interpreter's final flush does not complain either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (captured in tests)
        pass
    return SIGPIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
