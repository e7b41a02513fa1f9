"""One dataflow walker for the analyses over the IR: a fact per value, forward or backward.

Several analyses ask the same question of a graph: what is known about each value given what is
known about the values it is computed from (forward: a mask as an index expression, the position
axis of a rotary table, a sharding layout), or about the values computed from it (backward:
whether a value is needed, when it is last read). Each used to walk the graph its own way; this
module is the walk they share, so each client writes only its transfer function.

A fact is whatever the client says it is: there is no lattice and no fixpoint, because the graph
is acyclic and its nodes are in a topological order, so one sweep settles every value. Facts are
kept in a plain dict keyed by `Value` (by identity), which doubles as the memo: a client that asks
about one value at a time (`LazyForward`) walks back only to the values already known, so every
node's transfer runs at most once and the whole analysis stays linear in graph size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .graph import Node, Value

Facts = dict[Value, Any]
# node, the facts of its operands (None for an absent operand) -> one fact per output
ForwardTransfer = Callable[[Node, list[Any]], Sequence[Any]]
# node, the facts of its outputs -> one contribution per operand (None: contributes nothing)
BackwardTransfer = Callable[[Node, list[Any]], Sequence[Any]]


def forward(nodes: Iterable[Node], transfer: ForwardTransfer, source: Callable[[Value], Any],
            facts: Facts | None = None, stop: Node | None = None) -> Facts:
    """Facts of the outputs of `nodes`, visited in the order given (a topological order).

    An operand whose fact is not known yet (a graph input, a weight, a value computed outside
    `nodes`) gets `source(value)`, remembered in `facts`. `facts` may be pre-filled (seeds, or
    an earlier walk's memo) and is filled in place; the walk ends before `stop`. The transfer may
    write facts of values it creates into `facts` (a pass that rewrites as it walks).
    """
    facts = {} if facts is None else facts
    for node in nodes:
        if node is stop:
            break
        args = [None if v is None else fact_of(v, facts, source) for v in node.inputs]
        for value, fact in zip(node.outputs, transfer(node, args)):
            facts[value] = fact
    return facts


def fact_of(value: Value, facts: Facts, source: Callable[[Value], Any]) -> Any:
    """`value`'s fact, or its source fact (remembered) when no walk has produced one."""
    if value not in facts:
        facts[value] = source(value)
    return facts[value]


def backward(nodes: Sequence[Node], transfer: BackwardTransfer, sink: Callable[[Value], Any],
             merge: Callable[[Any, Any], Any], facts: Facts | None = None) -> Facts:
    """Facts flowing from readers to definitions, visiting `nodes` in reverse order.

    A value's fact starts as `sink(value)` (what the end of the graph knows about it: e.g. that
    it is a graph output) and merges in the contribution of every node that reads it; a node's
    transfer sees its outputs' settled facts, because every reader comes later in the order.
    """
    facts = {} if facts is None else facts
    for node in reversed(nodes):
        outs = [fact_of(v, facts, sink) for v in node.outputs]
        for value, contribution in zip(node.inputs, transfer(node, outs)):
            if value is not None and contribution is not None:
                facts[value] = merge(fact_of(value, facts, sink), contribution)
    return facts


def ancestry(values: Iterable[Value], known: Callable[[Value], bool] = lambda v: False,
             limit: int | None = None) -> list[Node] | None:
    """The nodes `values` are computed from, in a topological order, not walking past values
    `known` says are settled; None when there are more than `limit` of them.

    This is the demand-driven backward walk (what does this value depend on?); each value is
    visited once, so asking about many values with a growing `known` set stays linear.
    """
    order: list[Node] = []
    entered: set[Node] = set()
    for root in values:
        stack = [] if root is None or known(root) or root.producer is None else \
            [(root.producer, 0)]
        while stack:
            node, next_input = stack.pop()
            if next_input == 0:
                if node in entered:
                    continue
                entered.add(node)
                if limit is not None and len(entered) > limit:
                    return None
            for k in range(next_input, len(node.inputs)):
                v = node.inputs[k]
                if v is None or known(v) or v.producer is None or v.producer in entered:
                    continue
                stack += [(node, k + 1), (v.producer, 0)]
                break
            else:
                order.append(node)
    return order


class LazyForward:
    """Forward facts computed on demand, each node's at most once.

    `of(value)` runs the transfer over the unknown part of `value`'s ancestry, in a topological
    order, and remembers every fact found; later questions reuse them. Clients whose analysis is
    only needed at a few values (the masks of attention nodes) pay only for those values' cones.
    """

    def __init__(self, transfer: ForwardTransfer, source: Callable[[Value], Any],
                 facts: Facts | None = None):
        self.transfer = transfer
        self.source = source
        self.facts: Facts = {} if facts is None else facts

    def of(self, value: Value) -> Any:
        if value not in self.facts:
            nodes = ancestry([value], self.facts.__contains__)
            forward(nodes, self.transfer, self.source, self.facts)
        return fact_of(value, self.facts, self.source)
