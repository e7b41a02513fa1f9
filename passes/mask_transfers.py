"""Transfer rules of recognize_causal_masks: each op's output as an index expression of its inputs.

A rule takes one node's input expressions (`NodeTransfer.args`, `Indexed` values of
`index_expressions`) and returns its output's, or None when the op (or this use of it) is not
modelled; an op missing from `TRANSFERS` makes any mask built from it unreadable. Rules see
sizes only, never data.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy

from compiler.ir.dtypes import DType
from compiler.ir.graph import Node
from compiler.ir.symbolic import equal

from . import index_expressions as ix
from .index_expressions import INDEX, Indexed


@dataclass(frozen=True)
class NodeTransfer:
    """One node's transfer: its input expressions (None for an absent operand) and output type."""

    node: Node
    args: list[Indexed | None]
    ranges: ix.Ranges

    @property
    def shape(self):
        return self.node.outputs[0].shape

    @property
    def kind(self) -> str:
        return ix.kind_of(self.node.outputs[0].dtype)

    def attr(self, name: str):
        return self.node.attrs[name]

    def axis(self, name: str = "dim", rank: int | None = None) -> int:
        rank = len(self.shape) if rank is None else rank
        return self.attr(name) % rank if rank else 0


# -- creation -------------------------------------------------------------------------------------
def _constant(s: NodeTransfer):
    return ix.constant(s.shape, s.kind, ix.scalar(s.attr("value"), s.node.outputs[0].dtype))


def _arange(s: NodeTransfer):
    start, step = sympy.sympify(s.attr("start")), sympy.sympify(s.attr("step"))
    if start.is_integer is not True or not step.is_Integer:
        return None
    return ix.constant(s.shape, s.kind, start + step * INDEX[0])


# -- elementwise ----------------------------------------------------------------------------------
def _integer_op(fn: Callable[..., sympy.Basic]) -> Callable[[NodeTransfer], Indexed | None]:
    """Arithmetic on exact integers (floats too while they hold integers exactly)."""
    def transfer(s: NodeTransfer):
        if s.kind == "bool":
            return None
        return ix.combine(lambda *vs: fn(*vs) if all(v.is_integer for v in vs) else None,
                          s.kind, s.shape, *s.args)
    return transfer


def _compare(rel: Callable[..., sympy.Basic],
             on_bools: Callable[..., sympy.Basic] | None = None) -> Callable[[NodeTransfer], Any]:
    def transfer(s: NodeTransfer):
        if s.args[0].kind == "bool":
            return None if on_bools is None else ix.combine(on_bools, "bool", s.shape, *s.args)
        return ix.combine(lambda a, b: rel(a, b) if a.is_integer and b.is_integer else None,
                          "bool", s.shape, *s.args)
    return transfer


def _same(a, b):
    return sympy.Or(sympy.And(a, b), sympy.And(ix.negate(a), ix.negate(b)))


def _differ(a, b):
    return sympy.Or(sympy.And(a, ix.negate(b)), sympy.And(ix.negate(a), b))


def _logic(fn: Callable[..., sympy.Basic]) -> Callable[[NodeTransfer], Indexed | None]:
    """Logic on bool tensors (bitwise ops on integers are not modelled)."""
    def transfer(s: NodeTransfer):
        if any(a.kind != "bool" for a in s.args):
            return None
        return ix.combine(fn, "bool", s.shape, *s.args)
    return transfer


def _where(s: NodeTransfer):
    cond, a, b = (ix.broadcast(x, s.shape) for x in s.args)
    if None in (cond, a, b):
        return None
    c = cond.formula
    return ix.build(s.shape, s.kind, [(sympy.And(c, ca), va) for ca, va in a.cases]
                    + [(sympy.And(ix.negate(c), cb), vb) for cb, vb in b.cases])


def _cast(s: NodeTransfer):
    x, src, dst = s.args[0], s.node.inputs[0].dtype, s.node.outputs[0].dtype
    if dst == DType.bool:
        if x.kind == "bool":
            return x
        return ix.build(s.shape, "bool", [(c, sympy.Ne(v, 0)) for c, v in x.cases])
    if x.kind == "bool":
        return ix.build(s.shape, s.kind, ix.as_cases(x))
    opaque = [v for _, v in x.cases if not v.is_integer]
    if opaque and (s.kind == "int" or src != dst and any(v not in (sympy.oo, -sympy.oo)
                                                         for v in opaque)):
        return None  # rounding an opaque float is not modelled; the range check guards integers
    return ix.build(s.shape, s.kind, x.cases)


# -- views and data movement ----------------------------------------------------------------------
def same_dim(a, b) -> bool:
    return a == b or equal(a, b)


def _reshape(s: NodeTransfer):
    """Only reshapes that insert or remove size-1 dims (unsqueeze, squeeze, view as [1, 1, S])."""
    x = s.args[0]
    old = [d for d, n in enumerate(x.shape) if n != 1]
    new = [d for d, n in enumerate(s.shape) if n != 1]
    if len(old) != len(new) or not all(same_dim(x.shape[a], s.shape[b])
                                        for a, b in zip(old, new)):
        return None
    return ix.reindex(x, s.shape, {INDEX[a]: INDEX[b] for a, b in zip(old, new)})


def _expand(s: NodeTransfer):
    return ix.broadcast(s.args[0], s.shape)


def _permute(s: NodeTransfer):
    dims = [d % len(s.shape) for d in s.attr("dims")]
    return ix.reindex(s.args[0], s.shape, {INDEX[d]: INDEX[k] for k, d in enumerate(dims)})


def _position(s: NodeTransfer, index, size) -> sympy.Basic | None:
    """A start or index as torch reads it (negative ints count from the end); None if it may
    fall outside [0, size - 1]."""
    index = sympy.sympify(index)
    if index.is_Integer and index < 0:
        index = size + index
    if not (ix.nonpositive(-index, s.ranges) and ix.nonpositive(index - size + 1, s.ranges)):
        return None
    return index


def _slice(s: NodeTransfer):
    x, d, step = s.args[0], s.axis(), s.attr("step")
    size, length = sympy.sympify(x.shape[d]), sympy.sympify(s.shape[d])
    start = _position(s, s.attr("start"), size)
    if start is None or not isinstance(step, int) or step < 1:
        return None
    if not ix.nonpositive(start + step * (length - 1) - (size - 1), s.ranges):
        return None  # reads past the end for some size: not a plain strided window
    return ix.reindex(x, s.shape, {INDEX[d]: start + step * INDEX[d]})


def _select(s: NodeTransfer):
    x = s.args[0]
    d = s.axis(rank=x.rank)
    index = _position(s, s.attr("index"), sympy.sympify(x.shape[d]))
    if index is None:
        return None
    mapping = {INDEX[k]: INDEX[k - 1] for k in range(d + 1, x.rank)}
    return ix.reindex(x, s.shape, {**mapping, INDEX[d]: index})


def _concat(s: NodeTransfer):
    d, v, cases, offset = s.axis(), INDEX[s.axis()], [], sympy.Integer(0)
    for k, piece in enumerate(s.args):
        size = sympy.sympify(piece.shape[d])
        last = k == len(s.args) - 1
        window = sympy.And(sympy.true if k == 0 else sympy.Le(offset - v, 0),
                           sympy.true if last else sympy.Le(v - offset - size + 1, 0))
        shifted = ix.reindex(piece, s.shape, {INDEX[d]: v - offset})
        cases += [(sympy.And(window, c), value) for c, value in shifted.cases]
        offset += size
    return ix.build(s.shape, s.kind, cases)


def _gather_cases(s: NodeTransfer, x: Indexed, placed: dict[int, Indexed], keep: dict[int, int]):
    """x read with axis a at the values of `placed[a]` (already in output indices) and axis b at
    output index keep[b]; one case per combination of the index tensors' cases."""
    axes = list(placed)
    cases = []
    for combo in itertools.product(*(placed[a].cases for a in axes)):
        mapping = {INDEX[b]: INDEX[k] for b, k in keep.items()}
        mapping.update({INDEX[a]: value for a, (_, value) in zip(axes, combo)})
        read = ix.reindex(x, s.shape, mapping)
        if read is None:
            return None
        cases += [(sympy.And(c, *(cond for cond, _ in combo)), v) for c, v in read.cases]
    return ix.build(s.shape, s.kind, cases)


def _in_range(s: NodeTransfer, index: Indexed, size) -> bool:
    return index.kind == "int" and ix.provably_within(index, sympy.Integer(0),
                                                       sympy.sympify(size) - 1, s.ranges)


def _index(s: NodeTransfer):
    """numpy advanced indexing (`x[i0, _, i2]`), every index provably in range."""
    x, indices = s.args[0], s.args[1:]
    present = [a for a, t in enumerate(indices) if t is not None]
    if not present or not all(_in_range(s, indices[a], x.shape[a]) for a in present):
        return None
    width = len(s.shape) - (x.rank - len(present))  # rank of the broadcast index shape
    others = [a for a in range(x.rank) if a not in present]
    if present == list(range(present[0], present[-1] + 1)):
        base = present[0]
        keep = {a: a if a < base else a - len(present) + width for a in others}
    else:
        base = 0
        keep = {a: width + k for k, a in enumerate(others)}
    placed = {}
    for a in present:
        t = indices[a]
        placed[a] = ix.reindex(t, s.shape, {INDEX[k]: INDEX[base + width - t.rank + k]
                                            for k in range(t.rank)})
        if placed[a] is None:
            return None
    return _gather_cases(s, x, placed, keep)


def _index_select(s: NodeTransfer):
    x, index = s.args
    d = s.axis(rank=x.rank)
    if index.rank != 1 or not _in_range(s, index, x.shape[d]):
        return None
    placed = {d: ix.reindex(index, s.shape, {INDEX[0]: INDEX[d]})}
    return _gather_cases(s, x, placed, {a: a for a in range(x.rank) if a != d})


def _cumsum(s: NodeTransfer):
    """Closed form only for a summand independent of the scanned index: value * (i + 1)."""
    x, v = s.args[0], INDEX[s.axis()]
    cases = ix.as_cases(x)
    if any(v in c.free_symbols or v in value.free_symbols or not value.is_integer
           for c, value in cases):
        return None
    return ix.build(s.shape, s.kind, [(c, value * (v + 1)) for c, value in cases])


def _triangle(lower: bool) -> Callable[[NodeTransfer], Indexed | None]:
    def transfer(s: NodeTransfer):
        x, k = s.args[0], s.attr("diagonal")
        if len(s.shape) < 2:
            return None
        row, col = INDEX[len(s.shape) - 2], INDEX[len(s.shape) - 1]
        keep = sympy.Le(col - row - k, 0) if lower else sympy.Le(row - col + k, 0)
        if x.kind == "bool":
            return ix.build(s.shape, "bool", [(sympy.true, sympy.And(x.formula, keep))])
        return ix.build(s.shape, s.kind, [(sympy.And(c, keep), v) for c, v in x.cases]
                        + [(ix.negate(keep), sympy.Integer(0))])
    return transfer


TRANSFERS: dict[str, Callable[[NodeTransfer], Indexed | None]] = {
    "constant": _constant, "full": _constant, "arange": _arange,
    "add": _integer_op(lambda a, b: a + b), "sub": _integer_op(lambda a, b: a - b),
    "mul": _integer_op(lambda a, b: a * b), "neg": _integer_op(lambda a: -a),
    "eq": _compare(sympy.Eq, _same), "ne": _compare(sympy.Ne, _differ),
    "lt": _compare(sympy.Lt), "le": _compare(sympy.Le),
    "gt": _compare(sympy.Gt), "ge": _compare(sympy.Ge),
    "bitwise_and": _logic(sympy.And), "logical_and": _logic(sympy.And),
    "bitwise_or": _logic(sympy.Or), "logical_or": _logic(sympy.Or),
    "bitwise_xor": _logic(_differ), "logical_xor": _logic(_differ),
    "bitwise_not": _logic(ix.negate), "logical_not": _logic(ix.negate),
    "where": _where, "cast": _cast,
    "reshape": _reshape, "expand": _expand, "permute": _permute, "slice": _slice,
    "select": _select, "concat": _concat, "index": _index, "index_select": _index_select,
    "cumsum": _cumsum, "tril": _triangle(lower=True), "triu": _triangle(lower=False),
}
"""Op name -> transfer rule. An op missing here makes any mask built from it unreadable."""
