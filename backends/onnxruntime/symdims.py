"""Symbolic sizes as ONNX subgraphs: `reshape shape=[s0, 8, 64]` must work for every s0.

An artifact serves every size in its symbols' ranges, so a size expression in an attribute cannot
be baked in as a number. Each symbol is read from the graph input (and axis) it came from with
`Shape(input, start=axis, end=axis+1)`, and the expression is rebuilt from int64 Add/Mul/Div/Mod/
Max/Min nodes. Results are cached per expression, so a shape used by every layer costs one
subgraph; ONNX Runtime's constant folding never sees them, but they are a handful of tiny ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy

from compiler.errors import DayzeroError
from compiler.ir import DType
from compiler.ir.symbolic import Dim, normalize

if TYPE_CHECKING:
    from .builder import Builder


@dataclass(frozen=True)
class SymbolSource:
    """Where a size symbol can be read at run time: dim `axis` of graph input `input`, which is
    `scale * symbol + offset` (a derived Dim such as torch.export's `seq = 2*_seq`)."""

    input: str
    axis: int
    scale: int = 1
    offset: int = 0


def symbol_sources(inputs: list[tuple[str, tuple[Dim, ...]]]) -> dict[str, SymbolSource]:
    """The first bare-symbol occurrence of each symbol among the inputs (as the runtime binds);
    a symbol that no input has bare is read from an affine dim `a*s + c` of one (a > 0)."""
    sources: dict[str, SymbolSource] = {}
    derived: dict[str, SymbolSource] = {}
    for name, shape in inputs:
        for axis, dim in enumerate(shape):
            if isinstance(dim, sympy.Symbol) and dim.name not in sources:
                sources[dim.name] = SymbolSource(name, axis)
            elif isinstance(dim, sympy.Expr) and len(dim.free_symbols) == 1:
                sym = next(iter(dim.free_symbols))
                affine = _affine(dim, sym)
                if affine is not None and sym.name not in derived:
                    derived[sym.name] = SymbolSource(name, axis, *affine)
    return {**derived, **sources}


def _affine(dim: sympy.Expr, sym: sympy.Symbol) -> tuple[int, int] | None:
    """(a, c) when `dim` is `a*sym + c` with integers a > 0 and c."""
    poly = sympy.Poly(dim, sym) if dim.is_polynomial(sym) else None
    if poly is None or poly.degree() != 1:
        return None
    a, c = poly.all_coeffs()
    if not (a.is_Integer and c.is_Integer and a > 0):
        return None
    return int(a), int(c)


def emit_dims(b: Builder, dims: list[Dim], cache: dict[Any, str]) -> str:
    """A 1-D int64 tensor of `dims`; runs of static entries become one constant."""
    dims = [normalize(d) for d in dims]
    if all(isinstance(d, int) for d in dims):
        return b.ints(dims)
    key = ("dims", tuple(str(d) for d in dims))
    if key not in cache:
        parts: list[str] = []
        run: list[int] = []
        for d in dims:
            if isinstance(d, int):
                run.append(d)
                continue
            if run:
                parts.append(b.ints(run))
                run = []
            parts.append(_expr(b, sympy.sympify(d), cache))
        if run:
            parts.append(b.ints(run))
        cache[key] = parts[0] if len(parts) == 1 else b.op1("Concat", parts, axis=0)
    return cache[key]


def _expr(b: Builder, expr: sympy.Expr, cache: dict[Any, str]) -> str:
    """A 1-element int64 tensor computing `expr` from the inputs' shapes."""
    if expr not in cache:
        cache[expr] = _build(b, expr, cache)
    return cache[expr]


def _build(b: Builder, expr: sympy.Expr, cache: dict[Any, str]) -> str:
    if expr.is_Integer:
        return b.ints([int(expr)])
    if isinstance(expr, sympy.Symbol):
        return _symbol(b, expr.name)
    num, den = sympy.fraction(sympy.together(expr))
    if den != 1:
        return _floor_div(b, _expr(b, num, cache), _expr(b, den, cache))
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if isinstance(expr, sympy.ceiling):
            num = num + den - 1
        return _floor_div(b, _expr(b, sympy.expand(num), cache), _expr(b, den, cache))
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return _fold(b, "Mul", [_expr(b, expr.base, cache)] * int(expr.exp))
    ops = {sympy.Add: "Add", sympy.Mul: "Mul", sympy.Max: "Max", sympy.Min: "Min"}
    for kind, op_type in ops.items():
        if isinstance(expr, kind):
            return _fold(b, op_type, [_expr(b, a, cache) for a in expr.args])
    if isinstance(expr, sympy.Mod):
        a, m = (_expr(b, a, cache) for a in expr.args)
        return b.op1("Mod", [a, m], fmod=0)
    raise DayzeroError(f"size expression {expr} cannot be computed in the ONNX graph",
                       f"symbolic dim {expr}",
                       "use sizes built from + - * // % max min of the input dims")


def _symbol(b: Builder, name: str) -> str:
    source = b.sources.get(name)
    if source is None:
        raise DayzeroError(f"size symbol {name} is not a dim of any graph input, so its value "
                           "is unknown at run time", f"symbol {name}",
                           "give the graph an input whose shape has this symbol as a dim")
    size = b.op1("Shape", [source.input], start=source.axis, end=source.axis + 1)
    if source.offset:
        size = b.op1("Sub", [size, b.ints([source.offset])])
    if source.scale != 1:
        size = b.op1("Div", [size, b.ints([source.scale])])  # exact: the dim is a*s + c
    return size


def _fold(b: Builder, op_type: str, names: list[str]) -> str:
    out = names[0]
    for name in names[1:]:
        out = b.op1(op_type, [out, name])
    return out


def _floor_div(b: Builder, a: str, d: str) -> str:
    """floor(a / d): ONNX integer Div truncates, so subtract the (divisor-signed) remainder."""
    rem = b.op1("Mod", [a, d], fmod=0)
    return b.op1("Div", [b.op1("Sub", [a, rem]), d])


def as_int64_scalar(b: Builder, dim: Dim) -> str:
    """A 0-d int64 tensor of one dim (Range and TopK take scalars)."""
    dim = normalize(dim)
    if isinstance(dim, int):
        return b.const(dim, DType.i64)
    return b.op1("Squeeze", [b.dims([dim]), b.ints([0])])
