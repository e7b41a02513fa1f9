"""remove_noops: drop the identity views and casts that torch.export leaves behind.

Written as a table of small rules, op -> rule(node): a rule looks at one node and returns
`None` (no match), a `Value` (the node's output *is* that value, so the node goes), or a `Reroute`
(the node stays but reads other operands). Matching never changes the IR; `RemoveNoops.run`
applies the result. Adding a rule is one function and one table entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from compiler.ir import Graph, Node, TensorType, Value
from compiler.ir.symbolic import equal

from .base import Pass, PassResult
from .registry import register_pass


class Reroute(NamedTuple):
    """Keep the node, reading `inputs` instead of its current operands."""

    inputs: list[Value | None]


Rule = Callable[[Node], "Value | Reroute | None"]


def same_type(a: TensorType, b: TensorType) -> bool:
    """Equal dtypes and provably equal dims (structural equality first: simplify is slow)."""
    return a.dtype == b.dtype and a.rank == b.rank and all(
        x == y or equal(x, y) for x, y in zip(a.shape, b.shape))


def _identity_if_same_type(node: Node) -> Value | None:
    """Any view whose result has exactly its operand's type is the operand."""
    x = node.inputs[0]
    return x if same_type(x.type, node.output.type) else None


def _reshape(node: Node) -> Value | Reroute | None:
    x = node.inputs[0]
    if same_type(x.type, node.output.type):
        return x
    inner = x.producer
    if inner is not None and inner.op == "reshape":
        return Reroute([inner.inputs[0]])
    return None


def _permute(node: Node) -> Value | None:
    x = node.inputs[0]
    rank = max(x.type.rank, 1)
    identity = [d % rank for d in node.attrs["dims"]] == list(range(x.type.rank))
    return x if identity else None


def _slice(node: Node) -> Value | None:
    x, attrs = node.inputs[0], node.attrs
    whole = attrs["step"] == 1 and attrs["start"] == 0 and same_type(x.type, node.output.type)
    return x if whole else _part_of_concat(node)


def _part_of_concat(node: Node) -> Value | None:
    """A step-1 slice that takes back exactly one operand of a concat along the same dim (the
    functionalized `buf = new_empty(...); buf[..., :a] = x; buf[..., a:] = y` of DeepSeek's
    key assembly writes and re-reads its parts this way)."""
    inner, attrs = node.inputs[0].producer, node.attrs
    if inner is None or inner.op != "concat" or attrs["step"] != 1:
        return None
    rank = max(node.output.type.rank, 1)
    dim = attrs["dim"] % rank
    if inner.attrs["dim"] % rank != dim:
        return None
    offset = 0
    for part in inner.inputs:
        end = offset + part.shape[dim]
        if equal(attrs["start"], offset) and equal(attrs["end"], end):
            return part if same_type(part.type, node.output.type) else None
        offset = end
    return None


def _concat(node: Node) -> Value | None:
    """concat of one input, or of one input and empty ones (Phi-3's rotary concatenates the
    rotated head with its pass-through part, of size 0 when the whole head rotates)."""
    rank = node.output.type.rank
    dim = node.attrs["dim"] % rank if rank else 0
    kept = [v for v in node.inputs if not (rank and v.shape[dim] == 0)]
    if len(kept) == 1 and same_type(kept[0].type, node.output.type):
        return kept[0]
    return None


def _is_one(value: Value | None) -> bool:
    node = value.producer if value is not None else None
    if node is None or node.op != "constant" or node.output.type.rank != 0:
        return False
    number = node.attrs.get("value")
    return not isinstance(number, bool) and number == 1


def _times_one(node: Node) -> Value | None:
    """x * 1 and x / 1 (a 0-d constant one, result of x's type): exact in every dtype, NaN
    and -0.0 included. (x + 0 is not: -0.0 + 0.0 is +0.0.)"""
    if node.op == "div" and node.attrs.get("rounding_mode") is not None:
        return None
    for i in ((0, 1) if node.op == "mul" else (0,)):
        x, other = node.inputs[i], node.inputs[1 - i]
        if _is_one(other) and same_type(x.type, node.output.type):
            return x
    return None


RULES: dict[str, Rule] = {
    "reshape": _reshape,            # reshape to the same shape; reshape of a reshape
    "permute": _permute,            # identity permutation
    "expand": _identity_if_same_type,  # expand to the same shape
    "cast": _identity_if_same_type,    # cast to the same dtype
    "slice": _slice,                # start=0, step=1, covering the whole dim (or a concat's part)
    "concat": _concat,              # concat of one input (and empty ones)
    "mul": _times_one,              # x * 1 (a rotary table scaled by attention_scaling = 1)
    "div": _times_one,              # x / 1
}

# A chain of reroutes is bounded by the graph's depth; this only guards against a rule that
# keeps matching its own output.
_MAX_REWRITES_PER_NODE = 64


@register_pass
@dataclass(frozen=True)
class RemoveNoops(Pass):
    """Remove nodes that compute their operand unchanged, and collapse reshape chains.

    Needs: a valid graph. Rules (table `RULES`): reshape to the same shape, identity permute,
    expand to the same shape, cast to the same dtype, slice with start 0 and step 1 covering the
    whole dim (or exactly one operand of the concat it slices), concat of one input (besides
    empty ones), multiplication or division by a 0-d constant 1 are removed and their uses
    (graph outputs included) read the operand instead; reshape(reshape(x)) becomes one reshape
    of x.
    Guarantees: the graph computes the same values with the same types; a graph output that was
    a no-op result is rewired to the operand (so it may become an input or a weight); nodes left
    unused by a collapsed chain are removed, other pre-existing dead code is left to
    eliminate_dead_code.
    Why: torch.export keeps every `view`, `contiguous`-style cast and `[:]` slice the model
    wrote; each one costs a copy or a kernel in a backend and hides patterns from fusion.
    """

    name: ClassVar[str] = "remove_noops"
    summary: ClassVar[str] = ("remove identity reshapes/permutes/expands/casts/slices/concats "
                              "and x*1, x/1")

    def run(self, graph: Graph) -> PassResult:
        replace: dict[int, Value] = {}
        detached: list[Value] = []
        kept = []
        for node in graph.nodes:
            for i, v in enumerate(node.inputs):
                if v is not None and id(v) in replace:
                    graph.set_input(node, i, replace[id(v)])
            forward = _simplify(graph, node, detached)
            if forward is None:
                kept.append(node)
            else:
                replace[id(node.output)] = forward
        changed = bool(replace or detached)
        graph.outputs = [replace.get(id(v), v) for v in graph.outputs]
        graph.nodes = kept
        _remove_orphans(graph, detached)
        return PassResult(graph, changed)


def _simplify(graph: Graph, node: Node, detached: list[Value]) -> Value | None:
    """Apply the node's rule until it stops matching; the forwarded value if it is a no-op.

    Operands a reroute stops reading are appended to `detached`.
    """
    rule = RULES.get(node.op)
    for _ in range(_MAX_REWRITES_PER_NODE if rule else 0):
        result = rule(node)
        if isinstance(result, Reroute):
            detached.extend(v for v in node.inputs if v is not None)
            for i, v in enumerate(result.inputs):  # a reroute keeps the node's arity
                graph.set_input(node, i, v)
            continue
        return result
    return None


def _remove_orphans(graph: Graph, detached: list[Value]) -> None:
    """Remove nodes that lost their last reader because a chain was collapsed (and so on up)."""
    users = graph.users()
    outputs = {id(v) for v in graph.outputs}
    doomed: set[int] = set()
    stack = [v.producer for v in detached if v.producer is not None]
    while stack:
        node = stack.pop()
        if id(node) in doomed or any(id(v) in outputs for v in node.outputs):
            continue
        if any(u for v in node.outputs for u in users.get(v, []) if id(u) not in doomed):
            continue
        doomed.add(id(node))
        stack.extend(v.producer for v in node.inputs if v is not None and v.producer is not None)
    if doomed:
        graph.remove_nodes([n for n in graph.nodes if id(n) in doomed])
