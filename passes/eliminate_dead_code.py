"""eliminate_dead_code: drop nodes and weights that no graph output depends on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compiler.ir import Graph

from .base import Pass, PassResult
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class EliminateDeadCode(Pass):
    """Remove every node none of whose outputs reaches a graph output, then unused weights.

    Needs: a valid graph. The IR has no side-effecting ops, so a node matters only through its
    outputs; graph inputs are the signature and are never removed.
    Guarantees: every remaining node has an output that some graph output depends on; every
    remaining weight is read by a node or returned; the order of the remaining nodes is unchanged.
    Why: exports and the other passes (folding, CSE, no-op removal) leave nodes and weights
    behind; dead weights would otherwise be written into the artifact.
    """

    name: ClassVar[str] = "eliminate_dead_code"
    summary: ClassVar[str] = "remove nodes whose outputs are unused, and unused weights"

    def run(self, graph: Graph) -> PassResult:
        live = {id(v) for v in graph.outputs}
        kept = []
        for node in reversed(graph.nodes):
            if any(id(v) in live for v in node.outputs):
                kept.append(node)
                live.update(id(v) for v in node.inputs if v is not None)
        removed_nodes = len(kept) != len(graph.nodes)
        graph.nodes = kept[::-1]
        removed_weights = graph.remove_unused_weights()
        return PassResult(graph, removed_nodes or removed_weights)
