"""Position tables computed once at compile time, at the longest sequence the artifact accepts.

A rotary table (cos/sin of position x frequency) is computed in the graph from `arange(s0)` on
every call. When its row for position i provably depends on i alone, never on s0 itself, the
table at the symbol's upper bound holds every shorter table as its first rows; so it is
computed here once and stored as a constant, and GroupQueryAttention, which indexes its cache by
position, takes it whole: the per-call Range/Mul/Concat/Cos/Sin/Slice ops disappear.

The proof is a forward dataflow (compiler/ir/dataflow.py) with a transfer table over the ops
that build such tables: each value is "positional" along one axis (its elements at index i of
that axis depend on i only) or free of the symbol. Anything else (a reduction over positions, a
reshape that mixes the position axis with another, an input of the model) makes the table
ineligible, and it is computed per call. The tables of a graph are its named analysis
`position_tables` (`graph.analysis("position_tables").table(value)`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import sympy

from compiler.ir import Graph, Node, Value, get_op
from compiler.ir.analysis import register_analysis
from compiler.ir.dataflow import ancestry, fact_of, forward
from compiler.ir.ops.registry import META_ATTRS
from compiler.ir.symbolic import resolve

_INVALID = object()  # the value's dependence on the symbol is not positional
_MAX_NODES = 64
_MAX_ELEMENTS = 1 << 24


POSITION_TABLES = "position_tables"


class PositionTables:
    """The named analysis `position_tables` of one graph: the table of each value a converter
    asks about (None: computed per call), found once per value."""

    def __init__(self, graph: Graph):
        self.ranges = graph.symbols
        self.weight_data = graph.weight_data
        self.tables: dict[Value, np.ndarray | None] = {}

    def table(self, value: Value) -> np.ndarray | None:
        if value not in self.tables:
            self.tables[value] = precomputed_table(value, self.ranges, self.weight_data)
        return self.tables[value]


def _describe(graph: Graph, tables: PositionTables) -> list[str]:
    return [f"%{value.name}: " + ("computed per call" if table is None else
                                  f"precomputed {list(table.shape)} {table.dtype}")
            for value, table in tables.tables.items()]


@register_analysis(POSITION_TABLES, "rotary tables precomputed at the longest sequence",
                   _describe)
def position_tables(graph: Graph) -> PositionTables:
    return PositionTables(graph)


def precomputed_table(value: Value, ranges: Mapping[str, tuple[int, int | None]],
                      weight_data: Mapping[str, Any]) -> np.ndarray | None:
    """`value` evaluated at its position symbol's upper bound, when that is provably a table
    whose first rows are the value at every smaller size; None otherwise."""
    symbols = [d for d in value.shape if isinstance(d, sympy.Symbol)]
    if len(symbols) != 1 or any(not _static(d) for d in value.shape if d is not symbols[0]):
        return None
    symbol = symbols[0]
    high = ranges.get(symbol.name, (0, None))[1]
    nodes = ancestry([value], limit=_MAX_NODES)  # the subgraph must be small
    if high is None or nodes is None:
        return None

    def source(v: Value) -> Any:  # a weight at hand is free of the symbol; an input is not
        return None if v.name in weight_data else _INVALID

    def step(node: Node, axes: list) -> list:
        axis = _transfer(node, axes, symbol) if len(node.outputs) == 1 else _INVALID
        return [axis] * len(node.outputs)

    if fact_of(value, forward(nodes, step, source), source) != value.shape.index(symbol):
        return None  # _INVALID anywhere in the subgraph reaches `value`: transfers are strict
    elements = int(np.prod([high if d is symbol else int(d) for d in value.shape]))
    if elements > _MAX_ELEMENTS:
        return None
    return _evaluate(nodes, value, {symbol.name: high}, weight_data)


def _static(dim) -> bool:
    return isinstance(dim, int) or (isinstance(dim, sympy.Integer))


def _free_of(symbol, things) -> bool:
    def free(x) -> bool:
        if isinstance(x, sympy.Basic):
            return symbol not in x.free_symbols
        if isinstance(x, (list, tuple)):
            return all(free(y) for y in x)
        return True
    return all(free(x) for x in things)


def _axis_of(shape, symbol) -> int | None:
    hits = [i for i, d in enumerate(shape)
            if isinstance(d, sympy.Basic) and symbol in d.free_symbols]
    if not hits:
        return None
    return hits[0] if len(hits) == 1 and shape[hits[0]] == symbol else _INVALID


# -- transfer: the position axis of a node's result from its operands' -------------------------
def _elementwise(node: Node, axes: list, symbol) -> Any:
    out = node.outputs[0]
    want = _axis_of(out.shape, symbol)
    for v, axis in zip(node.inputs, axes):
        if v is None:
            continue
        if axis is None:
            if not _free_of(symbol, v.shape):
                return _INVALID
        elif axis + out.type.rank - v.type.rank != want:
            return _INVALID
    return want if _free_of(symbol, [a for k, a in node.attrs.items()
                                     if k not in META_ATTRS]) else _INVALID


def _arange(node: Node, axes: list, symbol) -> Any:
    a = node.attrs
    if not (_static(a["start"]) and _static(a["step"])):
        return _INVALID
    return _axis_of(node.outputs[0].shape, symbol)


def _creation(node: Node, axes: list, symbol) -> Any:
    value = node.attrs.get("value")
    if isinstance(value, sympy.Basic) and not _free_of(symbol, [value]):
        return _INVALID
    return _axis_of(node.outputs[0].shape, symbol)


def _reshape(node: Node, axes: list, symbol) -> Any:
    """Only reshapes that insert or remove size-1 dims keep the position axis apart."""
    (axis,) = axes[:1]
    src, out = node.inputs[0].shape, node.outputs[0].shape
    if axis is None:
        return None if _free_of(symbol, out) else _INVALID
    kept_in = [d for d in src if d != 1]
    kept_out = [d for d in out if d != 1]
    if len(kept_in) != len(kept_out) or any(a != b for a, b in zip(kept_in, kept_out)):
        return _INVALID
    return _axis_of(out, symbol)


def _along_other_axis(node: Node, axes: list, symbol) -> Any:
    """concat / slice / select along an axis that is not the position axis."""
    known = [a for a in axes if a is not None]
    if len(set(known)) > 1 or (len(known) != len([v for v in node.inputs if v is not None])
                               and node.op == "concat"):
        return _INVALID
    if not known:
        return _elementwise(node, axes, symbol)
    rank = node.inputs[0].type.rank
    if node.attrs["dim"] % rank == known[0] or not _free_of(symbol, list(node.attrs.values())):
        return _INVALID
    return _axis_of(node.outputs[0].shape, symbol)


def _permute(node: Node, axes: list, symbol) -> Any:
    axis = axes[0]
    if axis is None:
        return None
    return [d % node.inputs[0].type.rank for d in node.attrs["dims"]].index(axis)


_TRANSFER: dict[str, Callable[[Node, list, Any], Any]] = {
    "arange": _arange, "full": _creation, "constant": _creation, "reshape": _reshape,
    "concat": _along_other_axis, "slice": _along_other_axis, "select": _along_other_axis,
    "permute": _permute,
}


def _transfer(node: Node, axes: list, symbol) -> Any:
    if any(a is _INVALID for a in axes):
        return _INVALID
    rule = _TRANSFER.get(node.op)
    if rule is None and get_op(node.op).kind == "elementwise":
        rule = _elementwise
    return rule(node, axes, symbol) if rule is not None else _INVALID


def _evaluate(nodes: list[Node], value: Value, bindings: Mapping[str, int],
              weight_data: Mapping[str, Any]) -> np.ndarray:
    """Run the subgraph with the op table's reference semantics (torch, at compile time)."""
    import torch

    env: dict[int, Any] = {}

    def tensor(v: Value):
        if id(v) in env:
            return env[id(v)]
        return torch.as_tensor(weight_data[v.name])

    for node in nodes:
        args = [None if v is None else tensor(v) for v in node.inputs]
        attrs = {k: resolve(a, bindings) for k, a in node.attrs.items() if k not in META_ATTRS}
        result = get_op(node.op).reference(*args, **attrs)
        env[id(node.outputs[0])] = result
    return env[id(value)].detach().cpu().numpy()


