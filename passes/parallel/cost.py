"""A small cost model for balancing pipeline stages: FLOPs and bytes per node.

A node's cost is its roofline time in FLOP units, max(FLOPs, bytes x MEMORY_RATIO): matmuls and
attention are bound by arithmetic, elementwise ops and norms by memory traffic. Bytes crossing a
stage cut cost NETWORK_RATIO per byte. Symbolic dims are evaluated at planning sizes (each size
symbol at its upper bound, or 1024 when unbounded), the largest inputs the artifact accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from compiler.ir import Graph, Node, Value, get_op
from compiler.ir.symbolic import evaluate

MEMORY_RATIO = 10.0  # FLOPs one byte of memory traffic is worth (a CPU/GPU roofline ridge)
NETWORK_RATIO = 100.0  # FLOPs one byte sent between stages is worth
UNBOUNDED_SIZE = 1024
_FREE_KINDS = {"view"}  # no data moves (the backend reads through the view)
_PER_ELEMENT = {"normalization": 5, "reduction": 2, "elementwise": 1}


@dataclass(frozen=True)
class NodeCost:
    flops: int
    bytes: int
    weight_bytes: int
    network_bytes: int = 0  # what a collective moves between ranks

    @property
    def cost(self) -> float:
        return max(float(self.flops), self.bytes * MEMORY_RATIO) + \
            self.network_bytes * NETWORK_RATIO


def planning_sizes(graph: Graph) -> dict[str, int]:
    return {name: hi if hi is not None else max(lo, UNBOUNDED_SIZE)
            for name, (lo, hi) in graph.symbols.items()}


def numel(value: Value, sizes: Mapping[str, int]) -> int:
    count = 1
    for dim in value.type.shape:
        count *= evaluate(dim, sizes)
    return count


def nbytes(value: Value, sizes: Mapping[str, int]) -> int:
    return numel(value, sizes) * value.type.dtype.itemsize


def _flops(node: Node, sizes: Mapping[str, int]) -> int:
    out = numel(node.outputs[0], sizes) if node.outputs else 0
    if node.op in ("linear", "matmul"):
        contracted = node.inputs[0].type.shape[-1]
        return 2 * out * evaluate(contracted, sizes)
    if node.op == "scaled_dot_product_attention":
        q, k, v = (node.inputs[i] for i in range(3))
        scores = numel(q, sizes) // max(evaluate(q.type.shape[-1], sizes), 1) * \
            evaluate(k.type.shape[-2], sizes)
        return scores * (2 * evaluate(q.type.shape[-1], sizes)
                         + 2 * evaluate(v.type.shape[-1], sizes) + 5)
    if node.op == "conv":
        w = node.inputs[1].type.shape
        per_out = 1
        for d in w[1:]:
            per_out *= evaluate(d, sizes)
        return 2 * out * per_out
    kind = get_op(node.op).kind
    biggest = max([out] + [numel(v, sizes) for v in node.inputs if v is not None])
    return biggest * _PER_ELEMENT.get(kind, 1)


def node_cost(graph: Graph, node: Node, sizes: Mapping[str, int]) -> NodeCost:
    operands = {id(v): v for v in node.inputs if v is not None}.values()
    weights = sum(nbytes(v, sizes) for v in operands if graph.is_weight(v))
    kind = get_op(node.op).kind
    if kind in _FREE_KINDS or node.op == "shard":
        return NodeCost(0, 0, weights)
    if kind == "collective":
        return NodeCost(0, 0, weights, sum(nbytes(v, sizes) for v in node.outputs))
    moved = sum(nbytes(v, sizes) for v in operands) + sum(nbytes(v, sizes) for v in node.outputs)
    return NodeCost(_flops(node, sizes), moved, weights)
