"""Fusion groups: the elementwise, broadcast and reduction ops a kernel generator emits together.

A group is a set of nodes one generated kernel computes: vertical chains of elementwise ops,
reductions with their prologue (what computes their input) and epilogue (what uses their result),
and the broadcasts between them. Members are marked with a `fusion_group=<id>` attribute and placed
next to each other in the node order; `collect_groups` gives a kernel generator each group's
members, inputs and outputs. Members still run one by one on the reference backend.

How groups form (greedy, in node order, along producer -> consumer edges):
- Iteration domain: a kernel iterates over one full domain (`full` elements) and, with a
  reduction, over its rows (`full / reduced size`). Every reduction in a group reduces the same
  full domain to the same rows; every other member produces `full` elements, `rows` elements
  (computed once per row), or fewer, which the kernel recomputes for every element it broadcasts
  to.
- No cycles: two groups merge only if no path leaves one and re-enters the other through a
  third party (checked on the graph with groups contracted), so the groups can be ordered.
- Cost: a merge happens only if it lowers the memory traffic: bytes read from outside plus bytes
  written for readers outside, plus one element of traffic per recomputed element. Fusing a
  small expensive producer into a kernel that broadcasts it (recomputing it per element) is
  refused when the recomputation costs more than writing and reading its result once.
- At most `max_nodes` members per group.
Sizes with symbols are costed at the top of their range (or 1024 when unbounded).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import sympy

from compiler.ir import Graph, Node, Value, get_op
from compiler.ir.symbolic import evaluate, product

from ..rewrite.match import same_dim as equal

# Reductions a generated kernel computes in a group (row reductions and softmax-style scans).
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "prod", "var", "any", "all", "softmax",
                        "log_softmax"})
_UNBOUNDED_HINT = 1024


def _is_unit_reshape(node: Node) -> bool:
    def big(shape):
        return [d for d in shape if d != 1]
    a, b = big(node.inputs[0].shape), big(node.output.shape)
    return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))


def is_member(node: Node) -> bool:
    """Whether a node may join a fusion group."""
    if len(node.outputs) != 1 or any(v is None for v in node.inputs) or not node.inputs:
        return False
    if get_op(node.op).kind == "elementwise" or node.op in REDUCTIONS or node.op == "expand":
        return True
    return node.op == "reshape" and _is_unit_reshape(node)


class _GroupSizes:
    """Element counts of values (symbolic, compared exactly) and their costing hints."""

    def __init__(self, graph: Graph):
        self.hints = {name: (hi if hi is not None else max(lo, _UNBOUNDED_HINT))
                      for name, (lo, hi) in graph.symbols.items()}
        self._numel: dict[int, object] = {}

    def numel(self, value: Value):
        key = id(value)
        if key not in self._numel:
            self._numel[key] = product(value.shape)
        return self._numel[key]

    def hint(self, count) -> int:
        return count if isinstance(count, int) else evaluate(count, self.hints)

    def bytes(self, value: Value) -> int:
        return self.hint(self.numel(value)) * value.dtype.itemsize


def _reduced_rows(node: Node, sizes: _GroupSizes):
    x = node.inputs[0]
    if node.op in ("softmax", "log_softmax") and x.type.rank:  # of a 0-d x: one row
        dim = node.attrs["dim"] % x.type.rank
        return sympy.simplify(sympy.sympify(sizes.numel(x)) / x.shape[dim])
    return sizes.numel(node.output)


@dataclass(frozen=True)
class _Domain:
    full: object
    rows: object | None


def domain(nodes: list[Node], sizes: _GroupSizes) -> _Domain | str:
    """The iteration domain of a would-be group, or why its members cannot share one kernel."""
    reductions = [n for n in nodes if n.op in REDUCTIONS]
    if reductions:
        full = sizes.numel(reductions[0].inputs[0])
        rows = _reduced_rows(reductions[0], sizes)
        for r in reductions[1:]:
            if not (equal(sizes.numel(r.inputs[0]), full) and equal(_reduced_rows(r, sizes), rows)):
                return f"%{r.output.name} reduces another domain than %{reductions[0].output.name}"
    else:
        full = max((sizes.numel(n.output) for n in nodes), key=sizes.hint)
        rows = None
    for n in nodes:
        if sizes.hint(sizes.numel(n.output)) > sizes.hint(full):
            return f"%{n.output.name} is larger than the reduction domain"
    return _Domain(full, rows)


def traffic(nodes: list[Node], sizes: _GroupSizes, users: dict, returned: set[int]) -> int | None:
    """Bytes a kernel for `nodes` moves (plus recomputation); None if they cannot share one."""
    dom = domain(nodes, sizes)
    if isinstance(dom, str):
        return None
    inside = {id(n) for n in nodes}
    produced = {id(v) for n in nodes for v in n.outputs}
    reads = {id(v): v for n in nodes for v in n.inputs if id(v) not in produced}
    total = sum(sizes.bytes(v) for v in reads.values())
    for n in nodes:
        out = n.output
        if id(out) in returned or any(id(u) not in inside for u in users.get(out, [])):
            total += sizes.bytes(out)
        if n.op in REDUCTIONS or get_op(n.op).kind == "view":
            continue
        count = sizes.numel(out)
        per = dom.rows if dom.rows is not None and equal(count, dom.rows) else dom.full
        total += max(0, sizes.hint(per) - sizes.hint(count)) * out.dtype.itemsize
    return total


class Partition:
    """Union of nodes into groups, with the group-level cycle check."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.group_of: dict[int, int] = {}
        self.members: dict[int, list[Node]] = {}
        for i, node in enumerate(graph.nodes):
            self.group_of[id(node)] = i
            self.members[i] = [node]
        self.users = graph.users()

    def merged(self, a: int, b: int) -> list[Node]:
        return self.members[a] + self.members[b]

    def creates_cycle(self, a: int, b: int) -> bool:
        """Whether some path leaves group a or b and comes back into a or b."""
        both = {a, b}
        stack = [g for g in self._next_groups(self.merged(a, b)) if g not in both]
        seen = set(stack)
        while stack:
            for g in self._next_groups(self.members[stack.pop()]):
                if g in both:
                    return True
                if g not in seen:
                    seen.add(g)
                    stack.append(g)
        return False

    def _next_groups(self, nodes: list[Node]):
        for node in nodes:
            for out in node.outputs:
                for user in self.users.get(out, []):
                    yield self.group_of[id(user)]

    def union(self, a: int, b: int) -> None:
        for node in self.members[b]:
            self.group_of[id(node)] = a
        self.members[a] = self.merged(a, b)
        del self.members[b]


def partition(graph: Graph, max_nodes: int) -> list[list[Node]]:
    """Greedy partition of the member nodes; returns the groups of two or more nodes."""
    sizes = _GroupSizes(graph)
    part = Partition(graph)
    returned = {id(v) for v in graph.outputs}
    for node in graph.nodes:
        if not is_member(node):
            continue
        producers = sorted({v.producer for v in node.inputs if v.producer is not None
                            and is_member(v.producer)}, key=lambda p: -sizes.bytes(p.output))
        for producer in producers:
            a, b = part.group_of[id(producer)], part.group_of[id(node)]
            if a == b or len(part.members[a]) + len(part.members[b]) > max_nodes:
                continue
            merged = traffic(part.merged(a, b), sizes, part.users, returned)
            apart = [traffic(part.members[g], sizes, part.users, returned) for g in (a, b)]
            if merged is None or None in apart or merged >= sum(apart):
                continue
            if not part.creates_cycle(a, b):
                part.union(a, b)
    return [nodes for nodes in part.members.values() if len(nodes) > 1
            and any(get_op(n.op).kind != "view" for n in nodes)]


def order_groups(graph: Graph, groups: list[list[Node]]) -> list[Node]:
    """A topological order with every group contiguous (earliest first, stably)."""
    unit_of = {id(n): ("n", id(n)) for n in graph.nodes}
    for i, nodes in enumerate(groups):
        for n in nodes:
            unit_of[id(n)] = ("g", i)
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    units: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        units.setdefault(unit_of[id(n)], []).append(n)
    producer = {id(v): unit_of[id(n)] for n in graph.nodes for v in n.outputs}
    waiting = {u: 0 for u in units}
    dependents: dict[tuple, list[tuple]] = {u: [] for u in units}
    for u, nodes in units.items():
        for src in {producer[id(v)] for n in nodes for v in n.inputs
                    if v is not None and id(v) in producer} - {u}:
            waiting[u] += 1
            dependents[src].append(u)
    ready = [(index[id(nodes[0])], u) for u, nodes in units.items() if waiting[u] == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        _, u = heapq.heappop(ready)
        order.extend(units[u])
        for d in dependents[u]:
            waiting[d] -= 1
            if waiting[d] == 0:
                heapq.heappush(ready, (index[id(units[d][0])], d))
    if len(order) != len(graph.nodes):
        raise RuntimeError("fusion groups form a cycle; the partition check is broken")
    return order


@dataclass(frozen=True)
class FusionGroup:
    """One kernel's worth of nodes: members in order, what they read, what others need."""

    id: int
    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


def collect_groups(graph: Graph) -> list[FusionGroup]:
    """The fusion groups marked in `graph` (by `fusion_group` attributes), in node order."""
    by_id: dict[int, list[Node]] = {}
    for node in graph.nodes:
        if "fusion_group" in node.attrs:
            by_id.setdefault(node.attrs["fusion_group"], []).append(node)
    users = graph.users()
    returned = {id(v) for v in graph.outputs}
    out = []
    for gid, nodes in by_id.items():
        inside = {id(n) for n in nodes}
        produced = {id(v) for n in nodes for v in n.outputs}
        inputs = {id(v): v for n in nodes for v in n.inputs
                  if v is not None and id(v) not in produced}
        outputs = [v for n in nodes for v in n.outputs if id(v) in returned
                   or any(id(u) not in inside for u in users.get(v, []))]
        out.append(FusionGroup(gid, tuple(nodes), tuple(inputs.values()), tuple(outputs)))
    return out
