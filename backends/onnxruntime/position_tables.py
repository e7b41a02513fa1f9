"""Position tables computed once at compile time, at the longest sequence the artifact accepts.

A rotary table (cos/sin of position x frequency) is computed in the graph from `arange(s0)` on
every call. When its row for position i provably depends on i alone, never on s0 itself, the
table at the symbol's upper bound holds every shorter table as its first rows; so it is
computed here once and stored as a constant, and GroupQueryAttention, which indexes its cache by
position, takes it whole: the per-call Range/Mul/Concat/Cos/Sin/Slice ops disappear.

The proof is a transfer table over the ops that build such tables: each value is "positional"
along one axis (its elements at index i of that axis depend on i only) or free of the symbol.
Anything else (a reduction over positions, a reshape that mixes the position axis with
another, an input of the model) makes the table ineligible, and it is computed per call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import sympy

from compiler.ir import Node, Value, get_op
from compiler.ir.ops.registry import META_ATTRS
from compiler.ir.symbolic import resolve

_INVALID = object()  # the value's dependence on the symbol is not positional
_MAX_NODES = 64
_MAX_ELEMENTS = 1 << 24


def precomputed_table(value: Value, ranges: Mapping[str, tuple[int, int | None]],
                      weight_data: Mapping[str, Any]) -> np.ndarray | None:
    """`value` evaluated at its position symbol's upper bound, when that is provably a table
    whose first rows are the value at every smaller size; None otherwise."""
    symbols = [d for d in value.shape if isinstance(d, sympy.Symbol)]
    if len(symbols) != 1 or any(not _static(d) for d in value.shape if d is not symbols[0]):
        return None
    symbol = symbols[0]
    high = ranges.get(symbol.name, (0, None))[1]
    nodes = _subgraph(value, weight_data)
    if high is None or nodes is None:
        return None
    axes: dict[int, Any] = {}
    for node in nodes:
        axis = _transfer(node, [axes.get(id(v)) if v is not None else None for v in node.inputs],
                         symbol)
        if axis is _INVALID or len(node.outputs) != 1:
            return None
        axes[id(node.outputs[0])] = axis
    if axes.get(id(value)) != value.shape.index(symbol):
        return None
    elements = int(np.prod([high if d is symbol else int(d) for d in value.shape]))
    if elements > _MAX_ELEMENTS:
        return None
    return _evaluate(nodes, value, {symbol.name: high}, weight_data)


def _static(dim) -> bool:
    return isinstance(dim, int) or (isinstance(dim, sympy.Integer))


def _subgraph(value: Value, weight_data: Mapping[str, Any]) -> list[Node] | None:
    """The nodes `value` depends on, in execution order; None if a model input (or a weight
    without data) is among its sources, or the subgraph is not small."""
    order: list[Node] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        node = v.producer
        if node is None:
            if v.name not in weight_data:
                return None  # a graph input, or a weight whose data is not at hand
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        if len(order) > _MAX_NODES:
            return None
        stack.extend(i for i in node.inputs if i is not None)
    position = {id(n): i for i, n in enumerate(_topological(order))}
    return sorted(order, key=lambda n: position[id(n)])


def _topological(nodes: list[Node]) -> list[Node]:
    inside = {id(n) for n in nodes}
    done: set[int] = set()
    out: list[Node] = []

    def visit(node: Node) -> None:
        if id(node) in done:
            return
        done.add(id(node))
        for v in node.inputs:
            if v is not None and v.producer is not None and id(v.producer) in inside:
                visit(v.producer)
        out.append(node)

    for node in nodes:
        visit(node)
    return out


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


