"""Lowering fused ops back to primitives, for backends without a kernel for them.

Every fused op declares its decomposition (compiler/ir/ops/fused.py, `DECOMPOSITIONS`); this
module applies them to chosen nodes, repeatedly (a gated_mlp decomposes into linears and a silu;
a backend without silu gets mul and sigmoid), keeping each node's loc and its `origin`, so
provenance survives. The compile driver calls `decompose_unsupported(graph, backend.supports)`
before it checks that the backend can run every node.
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Graph, Node, get_op
from compiler.ir.ops import ShapeError
from compiler.ir.ops.fused import DECOMPOSITIONS, Emitter, decompose_into

from ..rewrite import RewriteRecord, restore_topological_order
from ..rewrite.driver import UNMARKED_KINDS

# A decomposition uses only ops simpler than the one it replaces, so chains are short; this
# bounds them anyway.
_MAX_ROUNDS = 8


def decompose_node(graph: Graph, node: Node) -> list[Node]:
    """Replace `node` by its decomposition in place; returns the nodes created."""
    emitter = Emitter(graph, before=node, loc=node.loc)
    results = decompose_into(emitter, node)
    for old, new in zip(node.outputs, results):
        graph.replace_uses(old, new)
    graph.remove_nodes([node])
    origin = node.attrs.get("origin")
    for created in emitter.created:
        if origin and get_op(created.op).kind not in UNMARKED_KINDS:
            created.attrs = get_op(created.op).complete_attrs({**created.attrs,
                                                              "origin": origin})
    return emitter.created


def decompose_nodes(graph: Graph, should: Callable[[Node], bool]) -> list[RewriteRecord]:
    """Decompose every node `should` selects (and selected nodes its decompositions create)."""
    records: list[RewriteRecord] = []
    refused: set[int] = set()
    for _ in range(_MAX_ROUNDS):
        chosen = [n for n in graph.nodes if n.op in DECOMPOSITIONS and should(n)
                  and id(n) not in refused]
        if not chosen:
            break
        for node in chosen:
            try:
                created = decompose_node(graph, node)
            except ShapeError:  # e.g. attention with a symbolic head size and no scale
                refused.add(id(node))
                continue
            records.append(RewriteRecord(f"decompose_{node.op}",
                                         f"%{node.outputs[0].name} {node.op}", node.loc,
                                         tuple(node.attrs.get("origin", ())),
                                         tuple(f"%{c.outputs[0].name} {c.op}" for c in created)))
    restore_topological_order(graph)
    return records


def decompose_unsupported(graph: Graph, supports: Callable[[Node], bool]) -> list[RewriteRecord]:
    """Decompose the nodes a backend cannot run (`supports(node)` is False) when they have a
    decomposition; nodes without one are left for the driver's coverage error."""
    return decompose_nodes(graph, lambda node: not supports(node))
