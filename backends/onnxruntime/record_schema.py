"""backend/lowering.json, checked against its schema before anything reads it.

The lowering record steers the load (session settings, the portable model, the float32-carried
inputs and outputs) and `dayzero inspect`. It is hashed in the manifest, which finds corruption,
but an edited artifact can carry any JSON there: before this check a wrong type surfaced as an
AttributeError, KeyError or TypeError somewhere in the load, and a thread count of 100000 as a
crash inside ONNX Runtime. So the file is parsed strictly (size, digits, no NaN) and checked
against `RECORD_SCHEMA`, a table of keys and what each holds; every violation is one
ArtifactError naming the file, the key path, what was expected and what was found.

The schema is data: `Int`, `OneOf`, `ListOf`, `MapOf` and `Fields` describe values, and
`check` is the one function that reads them. A thread count only has to be a non-negative
64-bit integer here: the load clamps it to the CPUs this process may run on, with a warning
(`session.clamped_threads`), because that limit is a fact of the machine, not of the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compiler.errors import ArtifactError

from .session import EXECUTION_MODES, OPT_LEVELS, SPINNING

MAX_RECORD_BYTES = 256 * 2**20  # a 100k-node model's record is ~20 MB
MAX_INT_DIGITS = 20
WIDE_DTYPES = ("bf16", "f8e4m3", "f8e5m2")  # lower.WIDE_IO: carried as float32 at the boundary
PORTABLE_MODEL = "model.portable.onnx"
FIX = "the artifact is corrupted or was edited; recompile it"


@dataclass(frozen=True)
class Int:
    lo: int
    hi: int

    def accepts(self, value: Any) -> bool:
        return type(value) is int and self.lo <= value <= self.hi

    def __str__(self) -> str:
        return f"an integer from {self.lo} to {self.hi}"


@dataclass(frozen=True)
class OneOf:
    values: tuple[Any, ...]

    def accepts(self, value: Any) -> bool:  # by type too: true is not 1
        return any(type(value) is type(v) and value == v for v in self.values)

    def __str__(self) -> str:
        return "one of " + ", ".join(json.dumps(v) for v in self.values)


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    value: Any  # keys are strings (JSON's)


@dataclass(frozen=True)
class Fields:
    required: Mapping[str, Any]
    optional: Mapping[str, Any] = field(default_factory=dict)


_NAMES = {str: "a string", bool: "true or false", ListOf: "a list", MapOf: "an object",
          Fields: "an object"}

COUNT = Int(0, 2**31 - 1)
THREADS = Int(0, 2**63 - 1)  # clamped at load
SESSION = Fields({}, {
    "graph_optimization_level": OneOf(OPT_LEVELS),
    "intra_op_threads": THREADS,
    "inter_op_threads": THREADS,
    "execution_mode": OneOf(EXECUTION_MODES),
    "cpu_mem_arena": bool,
    "mem_pattern": bool,
    "allow_spinning": OneOf(SPINNING),
})
NODES = ListOf(Fields({"node": str, "onnx": ListOf(str), "lowering": str}))
VARIANTS = MapOf(COUNT)
RECORD_SCHEMA = Fields(
    required={"opset": Int(1, 1000), "session": SESSION, "nodes": NODES},
    optional={
        "variants": VARIANTS,
        "wide_io": Fields({}, {"inputs": MapOf(OneOf(WIDE_DTYPES)),
                               "outputs": MapOf(OneOf(WIDE_DTYPES))}),
        "portable": Fields({"model": OneOf((PORTABLE_MODEL,)), "replaces": ListOf(str),
                            "nodes": NODES}, {"variants": VARIANTS}),
    })


def load_record(path: Path, where: str) -> dict[str, Any]:
    """The lowering record at `path`, parsed strictly and checked against RECORD_SCHEMA;
    errors name `where` (the file as the artifact lists it, e.g. backend/lowering.json)."""
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise ValueError(f"it is larger than {MAX_RECORD_BYTES // 2**20} MiB")
        record = json.loads(path.read_bytes().decode("utf-8"), parse_int=_int,
                            parse_constant=_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ArtifactError(f"{where} is not valid JSON ({why})", where, FIX) from None
    check(record, RECORD_SCHEMA, where)
    return record


def check(value: Any, spec: Any, where: str, path: str = "") -> None:
    """Raise ArtifactError at the first place `value` does not match `spec`."""
    if isinstance(spec, (Int, OneOf)):
        if not spec.accepts(value):
            _fail(where, path, str(spec), value)
    elif spec in (str, bool):
        if type(value) is not spec:
            _fail(where, path, _NAMES[spec], value)
    elif isinstance(spec, ListOf):
        if not isinstance(value, list):
            _fail(where, path, _NAMES[ListOf], value)
        for i, item in enumerate(value):
            check(item, spec.item, where, f"{path}[{i}]")
    elif isinstance(spec, MapOf):
        if not isinstance(value, dict):
            _fail(where, path, _NAMES[MapOf], value)
        for key, item in value.items():
            check(item, spec.value, where, _join(path, key))
    else:
        _check_fields(value, spec, where, path)


def _check_fields(value: Any, spec: Fields, where: str, path: str) -> None:
    if not isinstance(value, dict):
        _fail(where, path, _NAMES[Fields], value)
    known = {**spec.required, **spec.optional}
    for key in value:
        if key not in known:
            _raise(where, _join(path, key), f"is not a key this file has (known: "
                                            f"{', '.join(known)})")
    for key, inner in known.items():
        if key in value:
            check(value[key], inner, where, _join(path, key))
        elif key in spec.required:
            _raise(where, _join(path, key), f"is missing: it should be {_describe(inner)}")


def _describe(spec: Any) -> str:
    if isinstance(spec, (Int, OneOf)):
        return str(spec)
    return _NAMES[spec] if spec in (str, bool) else _NAMES[type(spec)]


def _fail(where: str, path: str, expected: str, value: Any) -> None:
    _raise(where, path, f"should be {expected}, found {_kind(value)} {_short(value)}")


def _raise(where: str, path: str, problem: str) -> None:
    key = path or "(top level)"
    raise ArtifactError(f"{where}: '{key}' {problem}", f"{where}: {key}", FIX)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (list, dict)) else \
        ("[...]" if isinstance(value, list) else "{...}")
    return text if len(text) <= 60 else text[:57] + "..."


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer {digits[:24]}... has more than {MAX_INT_DIGITS} digits")
    return int(digits)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
