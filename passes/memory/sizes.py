"""Byte sizes of values once every size symbol has a value.

Planning needs integers: a symbolic dim is evaluated at the symbol's upper bound (the default, so
one plan serves every size in range: sizes only grow with their symbols) or at a value the user
gives (`plan_memory{sizes=s0:128}`), which makes a smaller arena that refuses larger inputs.
Evaluating sympy is slow, so each distinct dim is evaluated once per `SizeEnv`.
"""

from __future__ import annotations

from collections.abc import Mapping

from compiler.errors import DayzeroError
from compiler.ir import Graph, TensorType
from compiler.ir.symbolic import Dim, evaluate, free_symbols

DEFAULT_ALIGNMENT = 64  # a cache line; also a multiple of every dtype's size


def align_up(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def parse_sizes(text: str) -> dict[str, int]:
    """`"s0:128;s1:16"` -> {"s0": 128, "s1": 16} (the form pass options take; "" is none)."""
    sizes: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, value = item.partition(":")
        if not sep or not name.strip().isidentifier() or not value.strip().isdigit():
            raise DayzeroError(f"size '{item}' is not SYMBOL:VALUE", f"sizes option '{text}'",
                               "write e.g. sizes=s0:128;s1:16")
        sizes[name.strip()] = int(value)
    return sizes


def format_sizes(sizes: Mapping[str, int]) -> str:
    return ";".join(f"{k}:{v}" for k, v in sorted(sizes.items()))


def symbol_values(graph: Graph, given: Mapping[str, int] | None = None) -> dict[str, int]:
    """A value for every size symbol: the given one (checked against its range) or its maximum."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(graph.symbols))
    if unknown:
        raise DayzeroError(f"sizes given for unknown symbol(s) {', '.join(unknown)}",
                           f"graph {graph.name}", "the graph's symbols are: "
                           + (", ".join(sorted(graph.symbols)) or "none"))
    values = {}
    for name, (lo, hi) in graph.symbols.items():
        if name in given:
            value = given[name]
            if value < lo or (hi is not None and value > hi):
                raise DayzeroError(f"size {name}:{value} is outside its range [{lo}, {hi}]",
                                   f"symbol {name}", "plan at a size inside the symbol's range")
            values[name] = value
        elif hi is None:
            raise DayzeroError(f"size symbol {name} has no upper bound, so buffers that depend "
                               "on it cannot be planned", f"symbol {name} in [{lo}, inf)",
                               f"give the dim a max in dynamic_shapes, or plan at a size: "
                               f"plan_memory{{sizes={name}:512}}")
        else:
            values[name] = hi
    return values


class SizeEnv:
    """Byte sizes of tensor types at fixed symbol values, each distinct dim evaluated once."""

    def __init__(self, values: Mapping[str, int]):
        self.values = dict(values)
        self._dims: dict[Dim, int] = {}

    def dim(self, dim: Dim) -> int:
        if isinstance(dim, int):
            return dim
        size = self._dims.get(dim)
        if size is None:
            missing = free_symbols(dim) - set(self.values)
            if missing:
                raise DayzeroError(f"dim {dim} uses undeclared size symbol(s) {sorted(missing)}",
                                   None, "declare every symbol with its range in the graph")
            size = self._dims[dim] = evaluate(dim, self.values)
        return size

    def numel(self, type: TensorType) -> int:
        count = 1
        for d in type.shape:
            count *= self.dim(d)
        return count

    def nbytes(self, type: TensorType) -> int:
        return self.numel(type) * type.dtype.itemsize
