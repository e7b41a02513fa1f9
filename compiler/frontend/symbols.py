"""Size symbols: torch's sympy (s70, FloorDiv, PythonMod, int_oo, ...) to the IR's symbolic dims.

torch.export names its size symbols arbitrarily (`s70`) and writes size arithmetic with its own
sympy functions (`FloorDiv`, `PythonMod`, `CeilToInt`, ...) that the IR's text form cannot print
back. This module renames the symbols `s0, s1, ...` in the order the graph inputs first use them
and rewrites every expression into plain sympy (`floor`, `ceiling`, `Mod`, `Max`, `Min`), the form
`compiler.ir.symbolic` parses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy
import torch
import torch.utils._sympy.functions as tfn
from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity

from compiler.ir.symbolic import Dim, normalize, symbol

from .size_bounds import decide_extrema

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class UnsupportedSymbol(ValueError):
    """An expression the IR cannot hold: unbacked (data-dependent) sizes or exotic functions.
    `symbol` names the data-dependent size, so every op it reaches is reported as one cause."""

    def __init__(self, message: str, symbol: str | None = None):
        super().__init__(message)
        self.symbol = symbol


def _floor_div(a, b):
    return sympy.floor(a / b)


def _ceil_div(a, b):
    return sympy.ceiling(a / b)


def _modular_indexing(base, divisor, modulus):
    return sympy.Mod(sympy.floor(base / divisor), modulus)


def _true_div(a, b):
    return a / b


# torch's sympy function -> builder of the plain-sympy equivalent (Max/Min are torch subclasses too)
_FUNCTIONS: dict[type, Callable[..., sympy.Expr]] = {
    tfn.FloorDiv: _floor_div,
    tfn.CleanDiv: _floor_div,
    tfn.CeilDiv: _ceil_div,
    tfn.IntTrueDiv: _true_div,
    tfn.FloatTrueDiv: _true_div,
    tfn.Mod: sympy.Mod,
    tfn.PythonMod: sympy.Mod,
    tfn.ModularIndexing: _modular_indexing,
    tfn.CeilToInt: sympy.ceiling,
    tfn.FloorToInt: sympy.floor,
    tfn.TruncToInt: lambda x: sympy.sign(x) * sympy.floor(abs(x)),
    tfn.ToFloat: lambda x: x,
    tfn.Identity: lambda x: x,
    tfn.PowByNatural: sympy.Pow,
    tfn.FloatPow: sympy.Pow,
    tfn.Max: sympy.Max,
    tfn.Min: sympy.Min,
}


class SymbolMap:
    """Renames torch's size symbols and converts their expressions; one per exported program."""

    def __init__(self) -> None:
        self.names: dict[sympy.Symbol, str] = {}
        self.bounds: dict[str, tuple[int, int | None]] = {}  # set by `ranges`

    def declare(self, torch_symbol: sympy.Symbol) -> str:
        """Give a backed torch symbol the next IR name (`s0`, `s1`, ...) unless it has one."""
        if torch_symbol not in self.names:
            self.names[torch_symbol] = f"s{len(self.names)}"
        return self.names[torch_symbol]

    def expr(self, expr) -> Dim | float | bool:
        """A torch sympy expression (or SymInt / int) as an IR dim or scalar expression."""
        if isinstance(expr, _SYM_TYPES):
            expr = expr.node.expr
        if isinstance(expr, bool):
            return expr
        if isinstance(expr, (int, float)):
            return expr
        converted = self._convert(sympy.sympify(expr))
        if isinstance(converted, sympy.Basic) and converted.is_Integer:
            return int(converted)
        if isinstance(converted, sympy.Basic) and converted.is_Float:
            return float(converted)
        if converted is sympy.true or converted is sympy.false:
            return bool(converted)
        # a Max/Min the export ranges decide is its winner (MPT's max(0, 128 - seq))
        converted = decide_extrema(converted, self.bounds)
        if isinstance(converted, sympy.Basic) and converted.is_Integer:
            return int(converted)
        return normalize(converted)

    def _convert(self, e: sympy.Basic) -> sympy.Basic:
        if isinstance(e, sympy.Symbol):
            if e not in self.names:
                unbacked = e.name.startswith("u")
                kind = "data-dependent (unbacked)" if unbacked else "undeclared"
                raise UnsupportedSymbol(f"size symbol {e} is {kind}",
                                        symbol=e.name if unbacked else None)
            return symbol(self.names[e])
        if isinstance(e, (IntInfinity, NegativeIntInfinity)):
            raise UnsupportedSymbol("an unbounded size appears inside an expression")
        if e.is_Number or not e.args:
            return e
        args = [self._convert(a) for a in e.args]
        for cls in type(e).__mro__:
            if cls in _FUNCTIONS:
                return _FUNCTIONS[cls](*args)
        if isinstance(e, (sympy.Add, sympy.Mul, sympy.Pow, sympy.floor, sympy.ceiling,
                          sympy.Mod, sympy.Max, sympy.Min)):
            return e.func(*args)
        raise UnsupportedSymbol(f"size expression {e} uses {type(e).__name__}")

    def ranges(self, range_constraints: Mapping) -> dict[str, tuple[int, int | None]]:
        """graph.symbols from ep.range_constraints: [lower, upper], int_oo upper -> None."""
        out: dict[str, tuple[int, int | None]] = {}
        for torch_symbol, name in self.names.items():
            vr = range_constraints.get(torch_symbol)
            lower = 1 if vr is None else _bound(vr.lower)
            upper = None if vr is None else _bound(vr.upper)
            out[name] = (max(lower if lower is not None else 1, 0), upper)
        self.bounds = out
        return out


def _bound(value) -> int | None:
    if isinstance(value, (IntInfinity, NegativeIntInfinity)) or value in (sympy.oo, -sympy.oo):
        return None
    return int(value)
