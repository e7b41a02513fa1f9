"""JSON from an artifact (manifest.json, a safetensors header), parsed with bounded work.

`json.loads` recurses once per nesting level (100,000 `[` raise RecursionError, and a deeper
C stack could do worse), turns a 5,000-digit integer into a ValueError of its own (or seconds of
work below Python's digit limit), accepts NaN and Infinity, auto-detects UTF-16, keeps the last
of two equal keys (two readers of one file could see different values) and returns lone
surrogates (`"\\ud800"`) that fail later, far from the file, when a path or a message is
encoded. Here the nesting is measured before parsing, without recursion, and each of those is a
`ValueError` naming what was refused, which the caller turns into its own error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1
_QUOTE = ord('"')
_CHUNK = 1 << 22  # bytes per numpy pass: bounded memory for a 100 MiB safetensors header


def nesting_depth(data: bytes) -> int:
    """The deepest bracket nesting of JSON text, brackets inside strings left out.

    Linear and without recursion or backtracking (a regex over strings was quadratic on
    `"\\"\\"...`): escaped backslashes, then escaped quotes, are blanked with
    `bytes.replace` (left to right, as JSON reads them), so every quote left opens or closes
    a string; a running XOR of the quotes marks what is inside one."""
    flat = np.frombuffer(data.replace(b"\\\\", b"__").replace(b'\\"', b"__"), np.uint8)
    depth = deepest = inside = 0
    for start in range(0, len(flat), _CHUNK):
        part = flat[start:start + _CHUNK]
        strings = np.bitwise_xor.accumulate((part == _QUOTE).view(np.uint8)) ^ inside
        inside = int(strings[-1])
        levels = np.cumsum(np.where(strings == 0, _OPEN[part], 0), dtype=np.int64) + depth
        deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def loads(data: bytes, *, max_depth: int, max_int_digits: int) -> Any:
    """The JSON value of `data` (UTF-8); ValueError saying why it is refused."""
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if nesting_depth(data) > max_depth:
        raise ValueError(f"nested more than {max_depth} deep")
    try:
        value = json.loads(text, parse_int=_int_parser(max_int_digits),
                           parse_float=_float, parse_constant=_constant,
                           object_pairs_hook=_object)
    except RecursionError:  # the depth check above makes this unreachable; kept as a bound
        raise ValueError(f"nested more than {max_depth} deep") from None
    _check_strings(value)
    return value


def _int_parser(max_digits: int) -> Callable[[str], int]:
    def parse(digits: str) -> int:
        if len(digits.lstrip("-")) > max_digits:
            raise ValueError(f"integer {digits[:24]}... has more than {max_digits} digits")
        return int(digits)
    return parse


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:24]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {twice[:80]!r} appears twice in one object")
    return out


def _check_strings(value: Any) -> None:
    """Every string and key is valid Unicode text (no lone surrogate from a `\\ud800` escape)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _text(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                _text(key)
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def _text(item: str) -> None:
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"string {item[:40]!r} holds a lone surrogate (not Unicode text)"
                         ) from None
