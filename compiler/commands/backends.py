"""`dayzero backends`: list the installed backends and what they run."""

from __future__ import annotations

from ..errors import DayzeroError


def add_parser(sub) -> None:
    p = sub.add_parser("backends", help="list installed backends")
    p.set_defaults(handler=backends_command)


def backends_command(args) -> int:
    import backends

    for name in backends.available():
        try:
            caps = backends.get(name).capabilities()
            static = "" if caps.symbolic_shapes else ", static shapes only"
            print(f"{name}: {len(caps.ops)} ops{static}")
        except DayzeroError as exc:
            print(f"{name}: unavailable ({exc.what})")
    return 0
