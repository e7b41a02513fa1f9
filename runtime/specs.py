"""Input and output specs of a compiled model, read from its manifest."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from compiler.errors import ArtifactError
from compiler.ir.dtypes import DTYPE_NAMES
from compiler.ir.limits import MAX_INT

from .dims import dim_symbols

DimSpec = Union[int, str]


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, IR dtype name, shape of ints and symbol strings.

    `ranges` gives each size symbol in the shape its inclusive range (lo, hi); hi None is unbounded.
    """

    name: str
    dtype: str
    shape: tuple[DimSpec, ...]
    ranges: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.name}: {self.type_str()}"

    def type_str(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


MAX_SPECS = 1 << 16       # inputs or outputs of one graph
MAX_RANK = 64             # dims of one tensor
MAX_NAME = 4096           # characters of a tensor name
MAX_SYMBOLS = 1 << 12     # size symbols of one graph
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def symbol_ranges(manifest: Mapping[str, Any]) -> dict[str, tuple[int, int | None]]:
    ranges = {}
    symbols = manifest.get("symbols", {})
    if not isinstance(symbols, dict) or len(symbols) > MAX_SYMBOLS:
        raise _bad(f"symbols is {_short(symbols)}, not an object of at most {MAX_SYMBOLS} "
                   "entries", "symbols")
    for name, bounds in symbols.items():
        if not _IDENTIFIER.match(name) or len(name) > 256:
            raise _bad(f"symbol {_short(name)} is not a name", f"symbols.{_short(name)}")
        if not (isinstance(bounds, list) and len(bounds) == 2 and type(bounds[0]) is int
                and (bounds[1] is None or type(bounds[1]) is int)):
            raise _bad(f"symbol {name} has range {_short(bounds)}", f"symbols.{name}")
        if bounds[0] < 0 or (bounds[1] is not None and bounds[1] < bounds[0]) \
                or max(bounds[0], bounds[1] or 0) > MAX_INT:
            raise _bad(f"symbol {name} has the empty, negative or too large range {bounds!r}",
                       f"symbols.{name}")
        ranges[name] = (bounds[0], bounds[1])
    return ranges


def specs_from_manifest(manifest: Mapping[str, Any], key: str,
                        prefix: str = "") -> list[TensorSpec]:
    """TensorSpecs of manifest["inputs"] or manifest["outputs"], checked for well-formedness.

    `prefix` is where `manifest` sits in manifest.json (`generation.forward.`), for errors."""
    ranges = symbol_ranges(manifest)
    entries = manifest.get(key)
    key = prefix + key
    if not isinstance(entries, list) or len(entries) > MAX_SPECS:
        raise _bad(f"{key} is {_short(entries)}, not a list of at most {MAX_SPECS} entries", key)
    specs = []
    for i, entry in enumerate(entries):
        field = f"{key}[{i}]"
        if not isinstance(entry, dict) or not all(k in entry for k in ("name", "dtype", "shape")):
            raise _bad(f"{key} entry {_short(entry)} lacks name, dtype or shape", field)
        name, dtype, shape = entry["name"], entry["dtype"], entry["shape"]
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise _bad(f"{key} entry {_short(entry)} has a name that is not a string of 1 to "
                       f"{MAX_NAME} characters", f"{field}.name")
        if not isinstance(dtype, str) or dtype not in DTYPE_NAMES:
            raise _bad(f"{key} entry {_short(entry)} has an unknown dtype", f"{field}.dtype")
        if not isinstance(shape, list) or len(shape) > MAX_RANK:
            raise _bad(f"{key} entry '{name}' has shape {_short(shape)}, not a list of at most "
                       f"{MAX_RANK} dims", f"{field}.shape")
        used: set[str] = set()
        for axis, dim in enumerate(shape):
            if isinstance(dim, str):
                try:
                    used |= dim_symbols(dim)
                except ArtifactError as exc:
                    raise _bad(exc.what, f"{field}.shape[{axis}]") from None
            elif type(dim) is not int or not 0 <= dim <= MAX_INT:
                raise _bad(f"{key} entry '{name}' has dim {_short(dim)}", f"{field}.shape[{axis}]")
        unknown = used - set(ranges)
        if unknown:
            raise _bad(f"{key} entry '{name}' uses undeclared symbol(s) {sorted(unknown)}",
                       f"{field}.shape")
        specs.append(TensorSpec(name, dtype, tuple(shape),
                                {s: ranges[s] for s in sorted(used)}))
    return specs


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(what: str, field: str | None = None) -> ArtifactError:
    where = f"manifest.json: {field}" if field else "manifest.json"
    return ArtifactError(f"manifest.json: {what}", where, "the artifact is corrupted; recompile it")
