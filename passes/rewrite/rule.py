"""Rules: a pattern, the checks it needs beyond its structure, and its replacement.

A rule is written as two small functions in the same style, the way onnxscript writes them:

    def pattern(op, x, w, eps):           # what to find
        return op.mul(w, op.mul(x, op.rsqrt(op.add(op.mean(...), eps))))
    def rewrite(op, x, w, eps, **_):      # what to put there (op builds real nodes)
        return op.rms_norm(x, w, normalized_shape=[...], eps=eps)
    RMS = rule("rms_norm", pattern, rewrite, check=lambda ctx, w, **_: ...)

`check(ctx, **bindings)` returns None (accept) or a string saying why the match is rejected
(`MatchResult.fail` also works), so a rejected fusion explains itself. Beyond `check`, a rule
refuses a match when a node it would remove is still needed outside the match (it would have to
be computed twice); `replaces` names matched values the rewrite replaces as well as the root, so
those may have outside readers (a residual sum that the fused add+norm returns too).

Rule sets compose with `+`; a set indexes its rules by the ops their roots can be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from compiler.ir import Graph, Node, Value, get_op

from .match import MatchResult, constant_value, describe, match_pattern
from .pattern import Pattern, build_pattern, root_ops


@dataclass(frozen=True)
class CheckContext:
    """What a rule's `check` may consult: the graph and the structural match."""

    graph: Graph
    match: MatchResult

    def constant(self, value: Value | None):
        """The scalar `value` holds when it is a known constant, else None."""
        return constant_value(self.graph, value)

    def node(self, name: str) -> Node | None:
        """The node that produced a named pattern value."""
        value = self.match.bindings.get(name)
        return value.producer if isinstance(value, Value) else None


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: Pattern
    rewrite: Callable[..., Value | Mapping[str, Value]]
    check: Callable[..., Any] | None = None
    replaces: tuple[str, ...] = ()

    @property
    def ops(self) -> set[str]:
        return root_ops(self.pattern)

    def match(self, graph: Graph, node: Node,
              users: Mapping[Value, list[Node]] | None = None) -> MatchResult:
        """The first structural match at `node` that passes every check; else the reason.

        Readers come from the values' use-lists unless `users` (a `Graph.users()` table) is
        given."""
        failure = MatchResult.fail(f"no {self.name} pattern at {describe(node.outputs[0], graph)}")
        for found in match_pattern(graph, self.pattern, node):
            if not found:
                return found
            why = self._escape(graph, found, users) or self._check(graph, found)
            if why is None:
                return found
            failure = MatchResult.fail(why, len(found.nodes), structure_matched=True)
        return failure

    def _escape(self, graph: Graph, found: MatchResult,
                users: Mapping[Value, list[Node]] | None) -> str | None:
        replaced = self.replaced_nodes(found)
        inside = {id(n) for n in found.nodes}
        returned = {id(v) for v in graph.outputs}
        for node in found.nodes:
            if id(node) in replaced or get_op(node.op).kind == "creation":
                continue
            for out in node.outputs:
                if id(out) in returned:
                    return f"{describe(out, graph)} is a graph output and would be computed twice"
                for user in out.users if users is None else users.get(out, []):
                    if id(user) not in inside:
                        return (f"{describe(out, graph)} is also read by "
                                f"{describe(user.outputs[0], graph)} "
                                "outside the pattern, so it would be computed twice")
        return _depends_on_replaced(graph, found, replaced)

    def replaced_nodes(self, found: MatchResult) -> set[int]:
        replaced = {id(found.anchor)}
        for name in self.replaces:
            value = found.bindings.get(name)
            if isinstance(value, Value) and value.producer is not None:
                replaced.add(id(value.producer))
        return replaced

    def _check(self, graph: Graph, found: MatchResult) -> str | None:
        if self.check is None:
            return None
        verdict = self.check(CheckContext(graph, found), **found.bindings)
        if verdict is None or verdict is True:
            return None
        if isinstance(verdict, MatchResult):
            return None if verdict.ok else verdict.reason
        return str(verdict) if verdict is not False else f"{self.name}: check failed"


def _depends_on_replaced(graph: Graph, found: MatchResult, replaced: set[int]) -> str | None:
    """A bound operand computed from a replaced value would make the fused node its own input.

    Nodes are in topological order, so only nodes after the earliest replaced one can be
    computed from it: the walk stops there instead of reaching back to the graph's inputs."""
    if len(replaced) == 1:
        return None
    outputs = {id(v) for n in found.nodes if id(n) in replaced for v in n.outputs}
    matched = {id(n) for n in found.nodes}
    earliest = min(graph.index(n) for n in found.nodes if id(n) in replaced)
    for name, value in found.bindings.items():
        if not isinstance(value, Value) or id(value.producer) in matched:
            continue  # a value inside the match, not an operand of it
        stack, seen = [value], set()
        while stack:
            v = stack.pop()
            if id(v) in outputs:
                return f"operand '{name}' is computed from a value the rewrite replaces"
            if v.producer is None or id(v) in seen or id(v.producer) in matched \
                    or graph.index(v.producer) < earliest:
                continue
            seen.add(id(v))
            stack.extend(i for i in v.producer.inputs if i is not None)
    return None


def rule(name: str, pattern: Callable[..., Any], rewrite: Callable[..., Any],
         check: Callable[..., Any] | None = None, replaces: Iterable[str] = ()) -> Rule:
    """A rule from a pattern function (`op`, then one parameter per variable) and a rewrite."""
    root, _ = build_pattern(pattern)
    return Rule(name, root, rewrite, check, tuple(replaces))


class RuleSet:
    """An ordered collection of rules, indexed by root op; `a + b` is a new set with both."""

    def __init__(self, rules: Iterable[Rule] = (), name: str = ""):
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.name = name
        names = [r.name for r in self.rules]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"rule names used twice: {duplicates}")
        self._by_op: dict[str, list[Rule]] = {}
        for r in self.rules:
            for op in r.ops:
                self._by_op.setdefault(op, []).append(r)

    def __add__(self, other: RuleSet) -> RuleSet:
        return RuleSet(self.rules + other.rules, "+".join(filter(None, [self.name, other.name])))

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self):
        return iter(self.rules)

    def for_op(self, op: str) -> list[Rule]:
        return self._by_op.get(op, [])

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rules]
