"""Field checks for `runtime.manifest`: every key read with its type and range, named in errors.

`At` is a position in manifest.json (`parallel.ranks[0].rank`); each check takes the value and
its position and returns the value typed, or raises an ArtifactError whose `where` is
`manifest.json: <key path>`, which says what was found and what was expected. Plain data in,
plain data out: no file is touched here (paths are checked for form only).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from compiler.errors import ArtifactError

FIX = "the artifact is corrupted or was edited; recompile it"
MAX_PATH_BYTES = 1024     # a listed path, as UTF-8 (Linux's PATH_MAX is 4096 for the whole)
MAX_COMPONENT_BYTES = 255  # one name in a listed path (NAME_MAX of every common file system)
MAX_ITEMS = 1 << 17        # entries of any list or object of the manifest read here
MAX_TEXT = 4096            # characters of a name, a backend, a version string
MAX_SIZE = 2**63 - 1       # a byte count or offset
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class At:
    """A position in manifest.json and the errors that name it."""

    def __init__(self, path: str = ""):
        self.path = path

    def __truediv__(self, key: str | int) -> At:
        if isinstance(key, int):
            return At(f"{self.path}[{key}]")
        return At(f"{self.path}.{key}" if self.path else key)

    def __str__(self) -> str:
        return self.path

    def error(self, what: str, fix: str = FIX) -> ArtifactError:
        return ArtifactError(f"manifest.json: {self.path} {what}", f"manifest.json: {self.path}",
                             fix)

    def wrong(self, value: Any, expected: str) -> ArtifactError:
        return self.error(f"is {short(value)}, not {expected}")


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def whole(value: Any, at: At, lo: int = 0, hi: int = MAX_SIZE) -> int:
    """An int (not a bool) in [lo, hi]."""
    if type(value) is not int or not lo <= value <= hi:
        raise at.wrong(value, f"a whole number in [{lo}, {hi}]")
    return value


def number(value: Any, at: At) -> float:
    """A finite int or float (not a bool): a statistic, printed, never sized from."""
    if type(value) not in (int, float) or not abs(value) < 1e300:
        raise at.wrong(value, "a number")
    return float(value)


def text(value: Any, at: At, limit: int = MAX_TEXT, pattern: re.Pattern | None = None) -> str:
    if not isinstance(value, str) or len(value) > limit or (
            pattern is not None and not pattern.match(value)):
        expected = f"a string of at most {limit} characters"
        raise at.wrong(value, expected if pattern is None else
                       f"{expected} matching {pattern.pattern}")
    return value


def items(value: Any, at: At, limit: int = MAX_ITEMS) -> list:
    if not isinstance(value, list) or len(value) > limit:
        raise at.wrong(value, f"a list of at most {limit} entries")
    return value


def fields(value: Any, at: At, limit: int = MAX_ITEMS) -> dict:
    if not isinstance(value, dict) or len(value) > limit:
        raise at.wrong(value, f"an object of at most {limit} entries")
    return value


def optional(raw: Mapping[str, Any], key: str, at: At, check, default: Any = None, **kw) -> Any:
    """`check(raw[key], at/key)` where the key is present and not null, else `default`."""
    value = raw.get(key)
    return default if value is None else check(value, at / key, **kw)


def relpath(rel: Any, what: str) -> str:
    """A relative POSIX path that stays inside its folder and that every file system call can
    take: no absolute path, '..', '.', backslash or NUL, at most MAX_COMPONENT_BYTES per name
    and MAX_PATH_BYTES in all (a 1,800-character name raised OSError from the first stat)."""
    shown = short(rel)
    if isinstance(rel, str) and len(rel) > MAX_PATH_BYTES:  # characters: at least as many bytes
        raise _too_long(what, shown, len(rel.encode("utf-8", "replace")))
    encoded = _utf8(rel) if isinstance(rel, str) and "\0" not in rel else None
    parts = PurePosixPath(rel).parts if encoded is not None else ()
    if not parts or "/".join(parts) != rel or "\\" in rel or ".." in parts:
        raise ArtifactError(f"{what} {shown} is not a plain relative path", shown,
                            "paths in an artifact must stay inside it")
    if len(encoded) > MAX_PATH_BYTES or any(len(p.encode()) > MAX_COMPONENT_BYTES
                                            for p in parts):
        raise _too_long(what, shown, len(encoded))
    return rel


def _too_long(what: str, shown: str, size: int) -> ArtifactError:
    return ArtifactError(f"{what} {shown} is too long ({size} bytes; a listed path has at most "
                         f"{MAX_PATH_BYTES} bytes, {MAX_COMPONENT_BYTES} per name)", shown, FIX)


def _utf8(value: str) -> bytes | None:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        return None


# -- sections ------------------------------------------------------------------------------------

def files(value: Any, at: At) -> dict[str, tuple[int, str]]:
    """`files`: {path: {size, sha256}} -> {path: (size, sha256)}."""
    out = {}
    for rel, info in fields(value, at).items():
        relpath(rel, "file listed in manifest.json")
        where = At(f"{at}[{short(rel)}]")
        info = fields(info, where)
        sha = text(info.get("sha256"), where / "sha256", 64, _SHA256)
        out[rel] = (whole(info.get("size"), where / "size"), sha)
    return out


_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


def listed(rel: Any, at: At, listing: Mapping[str, Any], what: str) -> str:
    """A path the manifest uses elsewhere (a graph, a weight file): it must be in `files`."""
    text(rel, at, MAX_PATH_BYTES)
    relpath(rel, what)
    if rel not in listing:
        raise ArtifactError(f"{rel} is used by the artifact but not listed in manifest.json "
                            f"(at {at})", rel, FIX)
    return rel


def stages(value: Any, at: At) -> list[dict[str, Any]]:
    """`parallel.stages`: what `dayzero inspect` prints of each pipeline stage."""
    for i, stage in enumerate(items(value, at, 1 << 16)):
        where = at / i
        stage = fields(stage, where)
        whole(stage.get("stage"), where / "stage", 0, 1 << 16)
        nodes = items(stage.get("nodes"), where / "nodes", 2)
        if len(nodes) != 2:
            raise (where / "nodes").wrong(nodes, "[first, end]")
        for j, n in enumerate(nodes):
            whole(n, where / "nodes" / j)
        for key in ("flops", "weight_bytes", "recv_bytes", "cost"):
            number(stage.get(key), where / key)
    return value


def groups(value: Any, at: At, world: int) -> dict[str, list[list[int]]]:
    """`parallel.groups`: {axis: [[rank, ...], ...]}, ranks of this world."""
    for axis, lists in fields(value, at, 16).items():
        where = At(f"{at}.{text(axis, at, 16, IDENTIFIER)}")
        for i, group in enumerate(items(lists, where, world)):
            for j, rank in enumerate(items(group, where / i, world)):
                whole(rank, where / i / j, 0, world - 1)
    return value


def coords(value: Any, at: At, world: int) -> dict[str, int]:
    for axis, index in fields(value, at, 16).items():
        whole(index, At(f"{at}.{text(axis, at, 16, IDENTIFIER)}"), 0, world - 1)
    return value


def aliases(value: Any, at: At, symbols: Mapping[str, Any]) -> dict[str, str]:
    """`symbol_aliases`: {Dim name: size symbol}, each symbol declared in `symbols`."""
    for alias, symbol in fields(value, at).items():
        where = At(f"{at}.{text(alias, at, 256, IDENTIFIER)}")
        if text(symbol, where, 256) not in symbols:
            raise where.wrong(symbol, f"a declared size symbol ({', '.join(sorted(symbols))})")
    return value
