"""Symbolic dimensions.

A dim is a Python int or a sympy expression over named size symbols (`s0`, `8*s0`, `floor(s0/2)`).
sympy keeps expressions canonical, so `str()` is a stable text form that the IR parser reads back
into an equal expression; every symbol is created through `symbol()` so assumptions always agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Union

import sympy

Dim = Union[int, sympy.Expr]


def symbol(name: str) -> sympy.Symbol:
    """The one way to make a size symbol: sizes are positive integers."""
    return sympy.Symbol(name, integer=True, positive=True)


def normalize(dim: Dim) -> Dim:
    """Plain ints for constant dims, so `Integer(4)` and `4` print and compare the same."""
    if isinstance(dim, sympy.Basic):
        if dim.is_Integer:
            return int(dim)
        return dim
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"not a dimension: {dim!r}")
    return dim


def is_static(dim: Dim) -> bool:
    return isinstance(normalize(dim), int)


def is_size(dim) -> bool:
    """Whether `dim` can be a size: an int >= 0, or an expression sympy knows is an integer
    (not a fraction such as s0/2, not zoo or nan from a division by zero)."""
    if isinstance(dim, bool):
        return False
    if isinstance(dim, int):
        return dim >= 0
    if isinstance(dim, sympy.Integer):
        return int(dim) >= 0
    return isinstance(dim, sympy.Expr) and dim.is_integer is True


def dim_str(dim: Dim) -> str:
    return str(normalize(dim))


def free_symbols(dim: Dim) -> set[str]:
    dim = normalize(dim)
    if isinstance(dim, int):
        return set()
    return {s.name for s in dim.free_symbols}


# Distinct positive sizes at which two dims are compared before sympy.simplify is asked to
# prove them equal: a difference that is not zero at one of them proves the dims differ
# without simplify, which can take minutes on a large expression (untrusted .dzir text).
_PROBES = ((2, 3, 5, 7, 11, 13, 17, 19, 23, 29), (31, 7, 1, 64, 5, 3, 128, 9, 2, 17))


def equal(a: Dim, b: Dim) -> bool:
    """True when two dims are provably the same size."""
    a, b = normalize(a), normalize(b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    diff = sympy.sympify(a) - sympy.sympify(b)
    if diff == 0:
        return True
    if diff.is_number:
        return False
    symbols = sorted(diff.free_symbols, key=lambda s: s.name)
    for probe in _PROBES:
        values = {s: probe[i % len(probe)] + i // len(probe) for i, s in enumerate(symbols)}
        value = diff.subs(values)
        if value.is_number and value.is_finite and value != 0:
            return False
    return sympy.simplify(diff) == 0


def evaluate(dim: Dim, bindings: Mapping[str, int]) -> int:
    """Concrete size of a dim once every symbol has a value."""
    dim = normalize(dim)
    if isinstance(dim, int):
        return dim
    missing = free_symbols(dim) - set(bindings)
    if missing:
        raise KeyError(f"no value for size symbol(s) {sorted(missing)} in {dim}")
    value = dim.subs({symbol(k): v for k, v in bindings.items() if k in free_symbols(dim)})
    return int(value)


def resolve(attr, bindings: Mapping[str, int]):
    """An attribute with every size expression in it (nested lists too) replaced by its value:
    what an op's reference receives once the symbols are bound."""
    if isinstance(attr, sympy.Basic):
        return evaluate(attr, bindings)
    if isinstance(attr, (list, tuple)):
        return [resolve(a, bindings) for a in attr]
    return attr


def upper_bound(dim: Dim, ranges: Mapping[str, tuple[int, int | None]]) -> int | None:
    """Largest value of a dim given symbol ranges (None if unbounded); sizes grow with symbols."""
    dim = normalize(dim)
    if isinstance(dim, int):
        return dim
    highs = {}
    for name in free_symbols(dim):
        hi = ranges.get(name, (1, None))[1]
        if hi is None:
            return None
        highs[name] = hi
    return evaluate(dim, highs)


def product(dims) -> Dim:
    out: Dim = 1
    for d in dims:
        out = normalize(out * normalize(d))
    return out


# Builders used by the IR parser; names follow sympy's printed form.
FUNCTIONS = {
    "floor": sympy.floor,
    "ceiling": sympy.ceiling,
    "Mod": sympy.Mod,
    "Max": sympy.Max,
    "Min": sympy.Min,
}
