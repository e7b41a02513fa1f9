"""Pipeline strings: `fold_constants,fuse{max_nodes=64},plan_memory` <-> a list of passes.

The string is the one way a pipeline is written down (command line, config file, artifact
manifest, crash reproducer), so `format_pipeline(parse_pipeline(s)) == s` for any pipeline written
in canonical form (no spaces, options in declaration order). Grammar:

    pipeline := [element ("," element)*]
    element  := NAME ["{" [NAME "=" VALUE ("," NAME "=" VALUE)*] "}"]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from compiler.errors import DayzeroError

from .base import Pass
from .registry import get_pass

DEFAULT_PIPELINE = ("remove_noops,fold_constants,eliminate_common_subexpressions,"
                    "recognize_causal_masks,eliminate_dead_code,plan_memory")

_ELEMENT = re.compile(r"\s*(?P<name>[A-Za-z_]\w*)\s*(?:\{(?P<opts>[^{}]*)\})?\s*(?P<end>,|$)")
_PREFIX = re.compile(r"\s*(?:[A-Za-z_]\w*\s*(?:\{[^{}]*\})?\s*)?")  # where a bad element breaks
_OPTION = re.compile(r"\s*(?P<key>[A-Za-z_]\w*)\s*=(?P<value>[^=]*)\Z")


def parse_pipeline(pipeline: str | Sequence[str | Pass]) -> list[Pass]:
    """Configured pass instances for a pipeline string (or a list of elements / passes).

    Unknown pass names, unknown options and ill-typed values raise DayzeroError naming the pass
    and option and listing what exists.
    """
    if not isinstance(pipeline, str):
        out: list[Pass] = []
        for element in pipeline:
            out.extend([element] if isinstance(element, Pass) else parse_pipeline(element))
        return out
    text = pipeline
    if not text.strip():
        return []
    passes, pos = [], 0
    while pos < len(text):
        match = _ELEMENT.match(text, pos)
        if match is None:
            raise _syntax_error(text, _PREFIX.match(text, pos).end())
        passes.append(_configure(match, text))
        pos = match.end()
        if match["end"] == "," and pos >= len(text):
            raise _syntax_error(text, pos)
    return passes


def format_pipeline(passes: Sequence[Pass], full: bool = False) -> str:
    """The pipeline string for configured passes; `full` spells out every option value."""
    return ",".join(p.spec(full=full) for p in passes)


def _configure(match: re.Match, text: str) -> Pass:
    name = match["name"]
    where = f"pipeline '{text}', column {match.start('name') + 1}"
    try:
        cls = get_pass(name)
    except DayzeroError as exc:
        raise DayzeroError(exc.what, where, exc.fix) from None
    options: dict[str, str] = {}
    body = match["opts"]
    if body is not None and body.strip():
        for item in body.split(","):
            opt = _OPTION.match(item)
            if opt is None:
                raise DayzeroError(f"pass '{name}': option '{item.strip()}' is not NAME=VALUE",
                                   where, f"write e.g. {name}{{option=value}}")
            if opt["key"] in options:
                raise DayzeroError(f"pass '{name}': option '{opt['key']}' is given twice", where)
            options[opt["key"]] = opt["value"]
    return cls.configure(options, where)


def _syntax_error(text: str, pos: int) -> DayzeroError:
    pointer = f"\n    {text}\n    {' ' * pos}^"
    return DayzeroError(f"cannot read pass pipeline at column {pos + 1}{pointer}",
                        f"pipeline '{text}'",
                        "write pass names separated by commas, options in braces: "
                        "fold_constants,eliminate_dead_code or fuse{max_nodes=64}")
