"""The rewrite driver: apply a rule set until nothing matches, recording every rewrite.

A sweep walks the nodes in order and, at each node, tries the rules whose root is that node's op;
the first match is applied at once (MLIR's greedy driver). Scanning resumes at the first node the
rewrite created, so a rule can build on another's result (rms_norm, then the weight folded into
it, then the residual add before it).

Only the first sweep tries every node. A rewrite puts on a worklist what it touched: the nodes
it created, the producers of the values it read, wrote or rewired, the readers of the values it
read, and the readers of what it wrote, as many levels down as a pattern reaches (64 nodes at
most); the next sweeps try only worklist nodes, in graph order, until the worklist is empty.
One last full sweep then confirms that nothing matches anywhere (and collects the misses
`--report` explains). So the work is linear in the graph:
about two tries per node plus a bounded neighbourhood per rewrite, never a rescan per rewrite.
Readers come from the values' use-lists (`Value.users`), kept current by the graph.

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
from .pattern import AnyOf, OpPattern
from .rule import Rule, RuleSet

# Nodes that compute nothing (views, data movement, constants) get no `origin` attribute.
UNMARKED_KINDS = frozenset({"view", "data_movement", "creation"})

# A sweep applies at most this many rewrites per node in the graph: a rule whose result matches
# itself again would otherwise loop forever.
_MAX_REWRITES_PER_NODE = 8

# After a rewrite, at most this many readers of what it touched go on the worklist: a value read
# by every layer (a mask, the rotary tables) must not make each rewrite cost O(layers). The final
# full sweep catches anything a capped walk left out.
_MAX_TOUCHED = 64

# Patterns look through no-op views and casts, so they reach a little deeper than they are written.
_NOOP_SLACK = 2


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
    did not match: where, and the reason from the deepest point the match reached; how near it
    came (`depth`, `structure_matched`: see MatchResult)."""

    rule: str
    anchor: str
    loc: str | None
    reason: str
    depth: int = 0
    structure_matched: bool = False


@dataclass
class DriverStats:
    """The work `apply_rules` did: rule match attempts, rewrites and sweeps (what the
    linear-scaling test counts, since timings are too noisy to test)."""

    attempts: int = 0
    rewrites: int = 0
    sweeps: int = 0


def apply_rules(graph: Graph, rules: RuleSet, max_sweeps: int = 16,
                misses: list[RewriteMiss] | None = None,
                stats: DriverStats | None = None) -> list[RewriteRecord]:
    """Rewrite `graph` in place with `rules` until nothing matches; `misses`, when given,
    receives every failed attempt of the last full sweep (what `--report` explains).

    `max_sweeps` bounds the sweeps that rewrite something; a worklist sweep that finds nothing
    is followed by the confirming full sweep without counting."""
    state = _State(graph, rules, stats if stats is not None else DriverStats())
    last: list[RewriteMiss] = []
    full, sweeps = True, 0
    while sweeps < max_sweeps:
        sweeps += 1
        found: list[RewriteMiss] = []
        changed = _sweep(state, full, found if misses is not None and full else None)
        if full:
            last = found
        if not changed:
            if full:
                break
            full, sweeps = True, sweeps - 1  # the worklist is empty: confirm everywhere
            continue
        full = False
    if misses is not None:
        misses.extend(last)
    return state.records


class _State:
    """What a run of the driver carries between sweeps: the worklist and the records."""

    def __init__(self, graph: Graph, rules: RuleSet, stats: DriverStats):
        self.graph, self.rules, self.stats = graph, rules, stats
        self.records: list[RewriteRecord] = []
        self.dirty: set[Node] = set()
        self.reach = max((_depth(r.pattern) for r in rules), default=0) + _NOOP_SLACK


def _sweep(state: _State, full: bool, misses: list[RewriteMiss] | None) -> bool:
    """One walk over the nodes in order: every node (`full`) or the worklist's."""
    graph, changed = state.graph, False
    state.stats.sweeps += 1
    budget = _MAX_REWRITES_PER_NODE * max(len(graph.nodes), 1)
    i = 0
    while i < len(graph.nodes) and budget > 0:
        node = graph.nodes[i]
        if not full and node not in state.dirty:
            i += 1
            continue
        state.dirty.discard(node)
        found, chosen, failed = None, None, []
        for candidate in state.rules.for_op(node.op):
            state.stats.attempts += 1
            found = candidate.match(graph, node)
            if found:
                chosen = candidate
                break
            failed.append((candidate.name, found))
        if chosen is None:
            if misses is not None and node.outputs:
                anchor = describe(node.outputs[0], graph)
                misses += [RewriteMiss(rule, anchor, node.loc, why.reason or "no match",
                                       why.depth, why.structure_matched)
                           for rule, why in failed]
            i += 1
            continue
        applied = _apply(graph, chosen, found)
        state.records.append(applied.record)
        state.stats.rewrites += 1
        changed, budget = True, budget - 1
        _touch(state, applied)
        # resume at what the rewrite built, so rules can build on it; nodes before it that the
        # rewrite removed shift the index down, never up
        created = applied.created
        i = graph.index(created[0]) if created else max(0, i - len(found.nodes))
    return changed


def _touch(state: _State, applied: _Applied) -> None:
    """Put on the worklist whatever the rewrite may have made matchable: the created nodes, the
    producers and readers of every value it read (it may have taken a reader away), and the
    readers of what it wrote or rewired up to `reach` levels down (a pattern rooted there may
    now fit)."""
    gone = set(applied.removed)
    dirty = state.dirty
    dirty.difference_update(gone)
    dirty.update(applied.created)
    written = [v for n in applied.created for v in n.outputs] + [new for _, new in applied.pairs]
    read = [v for n in (*applied.created, *applied.removed) for v in n.inputs if v is not None]
    for value in read + written:
        if value.producer is not None and value.producer not in gone:
            dirty.add(value.producer)
    budget = [_MAX_TOUCHED]
    _mark_readers(dirty, read, 1, budget)
    _mark_readers(dirty, written, state.reach, budget)


def _mark_readers(dirty: set[Node], values: list[Value], depth: int, budget: list[int]) -> None:
    """Readers of `values`, and theirs, `depth` levels down, while `budget` lasts."""
    for _ in range(depth):
        following = []
        for value in values:
            for user in value.users:
                if user in dirty:
                    continue
                if budget[0] == 0:
                    return
                dirty.add(user)
                budget[0] -= 1
                following.extend(user.outputs)
        values = following


def _depth(pattern) -> int:
    """How many op levels a pattern spans (how far up from its root a match can look)."""
    if isinstance(pattern, OpPattern):
        return 1 + max((_depth(p) for p in pattern.inputs if p is not None), default=0)
    if isinstance(pattern, AnyOf):
        return max((_depth(p) for p in pattern.alternatives), default=0)
    return 0


def explain(graph: Graph, node: Node | str, rules: RuleSet) -> list[tuple[str, str]]:
    """(rule, verdict) for every rule whose root could be `node`: "matches" or why not."""
    if isinstance(node, str):
        node = _find(graph, node)
    out = []
    for candidate in rules.for_op(node.op):
        found = candidate.match(graph, node)
        out.append((candidate.name, "matches" if found else found.reason or "no match"))
    return out


def _find(graph: Graph, name: str) -> Node:
    name = name.lstrip("%")
    for node in graph.nodes:
        if any(v.name == name for v in node.outputs):
            return node
    raise DayzeroError(f"no node defines %{name}", f"graph {graph.name}",
                       "give the name of a value a node defines")


@dataclass(frozen=True)
class _Applied:
    """One applied rewrite: its record, and what it changed (for the worklist)."""

    record: RewriteRecord
    created: list[Node]
    removed: list[Node]
    pairs: list[tuple[Value, Value]]


def apply_match(graph: Graph, rule: Rule, found: MatchResult) -> tuple[RewriteRecord, list[Node]]:
    """Apply one successful match; returns its record and the nodes it created."""
    applied = _apply(graph, rule, found)
    return applied.record, applied.created


def _apply(graph: Graph, rule: Rule, found: MatchResult) -> _Applied:
    anchor = found.anchor
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
    origin = _origin(removed)
    for node in builder.created:
        if get_op(node.op).kind not in UNMARKED_KINDS:
            node.attrs = get_op(node.op).complete_attrs({**node.attrs, "origin": origin})
    if len(pairs) > 1 and _read_too_early(graph, pairs):
        restore_topological_order(graph)  # a value replaced before the root had readers before it
    record = RewriteRecord(rule.name, f"%{anchor.outputs[0].name} {anchor.op}", anchor.loc,
                           tuple(origin), tuple(_label(n) for n in builder.created))
    return _Applied(record, builder.created, removed, pairs)


def _read_too_early(graph: Graph, pairs: list[tuple[Value, Value]]) -> bool:
    """Whether a rewired reader of a replacement now comes before the node computing it (the
    only way a rewrite can break the order, so the whole-graph sort runs only then)."""
    for _, new in pairs:
        if new.producer is not None:
            at = graph.index(new.producer)
            if any(graph.index(user) < at for user in new.users):
                return True
    return False


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
    """Remove the candidates, and the constants and no-ops feeding them, that nothing reads;
    returns them in graph order."""
    readers = _ReadCounts()
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
    removed = sorted(doomed.values(), key=lambda n: _position(graph, n))
    graph.remove_nodes(removed)
    return removed


def _position(graph: Graph, node: Node) -> int:
    try:
        return graph.index(node)
    except ValueError:
        return -1


class _ReadCounts(dict):
    """Reads left per value, from its use-list on first look (no whole-graph table)."""

    def __missing__(self, value: Value) -> int:
        self[value] = count = len(value.uses)
        return count

    def get(self, value: Value, default: int = 0) -> int:
        return self[value]


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
