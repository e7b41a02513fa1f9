"""Input and output specs of a compiled model, read from its manifest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from compiler.errors import ArtifactError
from compiler.ir.dtypes import DTYPE_NAMES

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


def symbol_ranges(manifest: Mapping[str, Any]) -> dict[str, tuple[int, int | None]]:
    ranges = {}
    for name, bounds in manifest.get("symbols", {}).items():
        if not (isinstance(bounds, list) and len(bounds) == 2 and type(bounds[0]) is int
                and (bounds[1] is None or type(bounds[1]) is int)):
            raise _bad(f"symbol {name} has range {bounds!r}")
        ranges[name] = (bounds[0], bounds[1])
    return ranges


def specs_from_manifest(manifest: Mapping[str, Any], key: str) -> list[TensorSpec]:
    """TensorSpecs of manifest["inputs"] or manifest["outputs"], checked for well-formedness."""
    ranges = symbol_ranges(manifest)
    specs = []
    for entry in manifest[key]:
        try:
            name, dtype, shape = entry["name"], entry["dtype"], tuple(entry["shape"])
        except (KeyError, TypeError):
            raise _bad(f"{key} entry {entry!r} lacks name, dtype or shape") from None
        if dtype not in DTYPE_NAMES or not isinstance(name, str):
            raise _bad(f"{key} entry {entry!r} has an unknown dtype")
        used: set[str] = set()
        for dim in shape:
            if isinstance(dim, str):
                used |= dim_symbols(dim)
            elif type(dim) is not int or dim < 0:
                raise _bad(f"{key} entry '{name}' has dim {dim!r}")
        unknown = used - set(ranges)
        if unknown:
            raise _bad(f"{key} entry '{name}' uses undeclared symbol(s) {sorted(unknown)}")
        specs.append(TensorSpec(name, dtype, shape, {s: ranges[s] for s in sorted(used)}))
    return specs


def _bad(what: str) -> ArtifactError:
    return ArtifactError(f"manifest.json: {what}", "manifest.json",
                         "the artifact is corrupted; recompile it")
