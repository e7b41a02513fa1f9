"""The rewrite driver: apply a rule set until nothing matches, recording every rewrite.

A sweep walks the nodes in order and, at each node, tries the rules whose root is that node's op;
the first match is applied at once (MLIR's greedy driver). Scanning resumes at the first node the
rewrite created, so a rule can build on another's result (rms_norm, then the weight folded into
it, then the residual add before it). Sweeps repeat until one changes nothing.

Applying a match: the rewrite builds its nodes before the root; the root's result (and any value
the rule `replaces`) is rewired to the new values; matched nodes left without readers are removed,
with constants only they read; the new compute nodes get an `origin` attribute listing the
export-level nodes they replace (flattened through earlier fusions), and keep the root's loc.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, Value, get_op

from .builder import RewriteBuilder
from .match import MatchResult, constant_value, describe, same_type, transparent_input
from .rule import Rule, RuleSet

# Nodes that compute nothing (views, data movement, constants) get no `origin` attribute.
UNMARKED_KINDS = frozenset({"view", "data_movement", "creation"})

# A sweep applies at most this many rewrites per node in the graph: a rule whose result matches
# itself again would otherwise loop forever.
_MAX_REWRITES_PER_NODE = 8


class RewriteError(DayzeroError):
    """A rule produced something invalid (a bug in the rule, not in the model)."""


@dataclass(frozen=True)
class RewriteRecord:
    """One applied rewrite: which rule, at which node, what it removed and what it created."""

    rule: str
    anchor: str
    loc: str | None
    replaced: tuple[str, ...]
    created: tuple[str, ...]


@dataclass(frozen=True)
class RewriteMiss:
    """A rule tried at a node in the last sweep, when no rewrite could change it any more, that
    did not match: where, and the reason from the deepest point the match reached."""

    rule: str
    anchor: str
    loc: str | None
    reason: str


def apply_rules(graph: Graph, rules: RuleSet, max_sweeps: int = 16,
                misses: list[RewriteMiss] | None = None) -> list[RewriteRecord]:
    """Rewrite `graph` in place with `rules` until a sweep changes nothing; `misses`, when given,
    receives every failed attempt of that last sweep (what `--report` explains)."""
    records: list[RewriteRecord] = []
    last: list[RewriteMiss] = []
    for _ in range(max_sweeps):
        last = []
        if not _sweep(graph, rules, records, last if misses is not None else None):
            break
    if misses is not None:
        misses.extend(last)
    return records


def _sweep(graph: Graph, rules: RuleSet, records: list[RewriteRecord],
           misses: list[RewriteMiss] | None = None) -> bool:
    changed = False
    users = graph.users()
    budget = _MAX_REWRITES_PER_NODE * max(len(graph.nodes), 1)
    i = 0
    while i < len(graph.nodes) and budget > 0:
        node = graph.nodes[i]
        found, chosen, failed = None, None, []
        for candidate in rules.for_op(node.op):
            found = candidate.match(graph, node, users)
            if found:
                chosen = candidate
                break
            failed.append((candidate.name, found.reason or "no match"))
        if chosen is None:
            if misses is not None and node.outputs:
                anchor = describe(node.outputs[0], graph)
                misses += [RewriteMiss(rule, anchor, node.loc, why) for rule, why in failed]
            i += 1
            continue
        record, created = apply_match(graph, chosen, found)
        records.append(record)
        changed, budget = True, budget - 1
        users = graph.users()
        # resume at what the rewrite built, so rules can build on it; nodes before it that the
        # rewrite removed shift the index down, never up
        i = graph.nodes.index(created[0]) if created else max(0, i - len(found.nodes))
    return changed


def explain(graph: Graph, node: Node | str, rules: RuleSet) -> list[tuple[str, str]]:
    """(rule, verdict) for every rule whose root could be `node`: "matches" or why not."""
    if isinstance(node, str):
        node = _find(graph, node)
    users = graph.users()
    out = []
    for candidate in rules.for_op(node.op):
        found = candidate.match(graph, node, users)
        out.append((candidate.name, "matches" if found else found.reason or "no match"))
    return out


def _find(graph: Graph, name: str) -> Node:
    name = name.lstrip("%")
    for node in graph.nodes:
        if any(v.name == name for v in node.outputs):
            return node
    raise DayzeroError(f"no node defines %{name}", f"graph {graph.name}",
                       "give the name of a value a node defines")


def apply_match(graph: Graph, rule: Rule, found: MatchResult) -> tuple[RewriteRecord, list[Node]]:
    """Apply one successful match; returns its record and the nodes it created."""
    anchor = found.anchor
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    builder = RewriteBuilder(graph, anchor)
    result = rule.rewrite(builder, **found.bindings)
    pairs = _replacements(rule, found, result)
    for old, new in pairs:
        if not same_type(old.type, new.type):
            raise RewriteError(f"rule {rule.name} replaced {describe(old)}: {old.type} by a "
                               f"value of type {new.type}", anchor.loc,
                               "this is a bug in the rule; its rewrite must keep result types")
        graph.replace_uses(old, new)
    removed = _remove_dead(graph, found.nodes)
    _inherit_names(pairs, removed, builder.created)
    removed.sort(key=lambda n: position.get(id(n), -1))
    origin = _origin(removed)
    for node in builder.created:
        if get_op(node.op).kind not in UNMARKED_KINDS:
            node.attrs = get_op(node.op).complete_attrs({**node.attrs, "origin": origin})
    if len(pairs) > 1:  # values replaced before the root may have readers before it
        restore_topological_order(graph)
    record = RewriteRecord(rule.name, f"%{anchor.outputs[0].name} {anchor.op}", anchor.loc,
                           tuple(origin), tuple(_label(n) for n in builder.created))
    return record, builder.created


def _replacements(rule: Rule, found: MatchResult, result) -> list[tuple[Value, Value]]:
    anchor = found.anchor
    if isinstance(result, Value):
        return [(anchor.outputs[0], result)]
    if not isinstance(result, Mapping):
        raise RewriteError(f"rule {rule.name} returned {result!r}", anchor.loc,
                           "a rewrite returns the new value or a dict {pattern name: value}")
    pairs = []
    for name, new in result.items():
        old = found.bindings.get(name)
        if not isinstance(old, Value) or old.producer is None or id(old.producer) not in \
                rule.replaced_nodes(found):
            raise RewriteError(f"rule {rule.name} replaces '{name}', which is not its root or "
                               "one of its `replaces`", anchor.loc, "name the value in replaces")
        pairs.append((old, new))
    if not any(old.producer is anchor for old, _ in pairs):
        raise RewriteError(f"rule {rule.name} did not replace its root", anchor.loc,
                           "return the root's replacement under the root's pattern name")
    return pairs


def _inherit_names(pairs, removed: list[Node], created: list[Node]) -> None:
    """New results take the names of the values they replace (now gone), so dumps read the same
    before and after a rewrite; the fresh names they had are simply never used again."""
    gone = {id(v) for n in removed for v in n.outputs}
    new_values = {id(v) for n in created for v in n.outputs}
    for old, new in pairs:
        if id(old) in gone and id(new) in new_values:
            new.name = old.name


def _label(node: Node) -> str:
    return f"%{node.outputs[0].name} {node.op}"


def _remove_dead(graph: Graph, candidates: list[Node]) -> list[Node]:
    """Remove the candidates, and the constants and no-ops feeding them, that nothing reads."""
    readers = {v: len(nodes) for v, nodes in graph.users().items()}
    returned = {id(v) for v in graph.outputs}
    pending = list(candidates)
    doomed: dict[int, Node] = {}
    while pending:
        node = pending.pop()
        if id(node) in doomed or any(readers.get(v, 0) or id(v) in returned
                                     for v in node.outputs):
            continue
        doomed[id(node)] = node
        for v in node.inputs:
            if v is None:
                continue
            readers[v] -= 1
            producer = v.producer
            if producer is not None and (producer in candidates or _is_constant(graph, producer)
                                         or transparent_input(graph, producer) is not None):
                pending.append(producer)
    graph.remove_nodes(doomed.values())
    return list(doomed.values())


def _is_constant(graph: Graph, node: Node) -> bool:
    return get_op(node.op).kind == "creation" or (
        len(node.outputs) == 1 and constant_value(graph, node.outputs[0]) is not None)


def _origin(removed: list[Node]) -> list[str]:
    entries: list[str] = []
    for node in removed:
        if "origin" in node.attrs:
            entries.extend(node.attrs["origin"])
        elif get_op(node.op).kind != "creation":
            entries.append(_label(node))
    return list(dict.fromkeys(entries))


def restore_topological_order(graph: Graph) -> bool:
    """Reorder nodes (stably: earliest first) if a value is read before it is defined."""
    defined = {id(v) for v in graph.inputs} | {id(v) for v in graph.weights.values()}
    for node in graph.nodes:
        if any(v is not None and id(v) not in defined for v in node.inputs):
            break
        defined.update(id(v) for v in node.outputs)
    else:
        return False
    producer = {id(v): i for i, n in enumerate(graph.nodes) for v in n.outputs}
    waiting = [0] * len(graph.nodes)
    dependents: list[list[int]] = [[] for _ in graph.nodes]
    for i, node in enumerate(graph.nodes):
        for src in {producer[id(v)] for v in node.inputs if v is not None and id(v) in producer}:
            waiting[i] += 1
            dependents[src].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(graph.nodes[i])
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(graph.nodes):
        raise RewriteError("a rewrite made the graph cyclic", f"graph {graph.name}",
                           "this is a bug in a fusion rule")
    graph.nodes = order
    return True
