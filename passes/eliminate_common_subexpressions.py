"""eliminate_common_subexpressions: compute each distinct (op, operands, attributes) once."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

from compiler.ir import Graph, Node, Value, get_op

from .base import Pass, PassResult
from .registry import register_pass


def attr_key(value: Any) -> Hashable:
    """A hashable key equal only for attribute values that print the same.

    Tagged with the Python type so `1`, `1.0` and `true` stay apart, and floats keyed by `repr`
    so `0.0` and `-0.0` (equal in Python, different as tensors) never merge.
    """
    if isinstance(value, (list, tuple)):
        return ("list", tuple(attr_key(v) for v in value))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def node_key(node: Node, order: dict[int, int]) -> Hashable:
    """Identity of what a node computes; commutative operands are sorted by definition order."""
    operands = [None if v is None else order[id(v)] for v in node.inputs]
    if get_op(node.op).commutative and None not in operands:
        operands.sort()
    attrs = tuple(sorted((k, attr_key(v)) for k, v in node.attrs.items()))
    return node.op, tuple(operands), attrs


@register_pass
@dataclass(frozen=True)
class EliminateCommonSubexpressions(Pass):
    """Merge nodes that apply the same op to the same operands with the same attributes.

    Needs: a valid graph; ops are pure (the IR has no side effects), so equal keys mean equal
    results. Operands of commutative ops (per the op table) are compared as a sorted multiset, so
    `add(a, b)` and `add(b, a)` merge; constant-creating nodes with equal attributes merge too.
    Guarantees: no two remaining nodes have the same key; the first occurrence survives (with its
    operand order and location), later duplicates are removed and their uses rewired to it, so
    the node order stays topological. Graph outputs are rewired the same way.
    Why: exports repeat work (the same mask, cast or reshape per layer), and every duplicate costs
    a kernel launch and memory.
    """

    name: ClassVar[str] = "eliminate_common_subexpressions"
    summary: ClassVar[str] = "merge nodes with the same op, operands and attributes"

    def run(self, graph: Graph) -> PassResult:
        order = {id(v): i for i, v in enumerate(graph.values())}
        seen: dict[Hashable, Node] = {}
        replace: dict[int, Value] = {}
        kept = []
        for node in graph.nodes:
            for i, v in enumerate(node.inputs):
                if v is not None and id(v) in replace:
                    graph.set_input(node, i, replace[id(v)])
            key = node_key(node, order)
            first = seen.get(key)
            if first is None:
                seen[key] = node
                kept.append(node)
                continue
            for dup, keep in zip(node.outputs, first.outputs):
                replace[id(dup)] = keep
        graph.outputs = [replace.get(id(v), v) for v in graph.outputs]
        changed = len(kept) != len(graph.nodes)
        graph.nodes = kept
        return PassResult(graph, changed)
