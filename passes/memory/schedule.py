"""Execution-order scheduling for memory: pick a topological order with a lower peak.

The IR's ops are pure, so any topological order computes the same values; what changes is how
many buffers are live together. The list scheduler below repeatedly runs, among the nodes whose
operands are ready, the one that grows live memory the least (bytes it allocates minus bytes it
frees by being the last reader of a buffer), ties going to the node that came first. That
finishes a branch that shrinks memory (a reduction, a projection down) before starting another
branch that grows it. Nodes without operands (constants, `arange`, `full`) are run just before
their first reader, so they never sit live waiting. Collectives keep their relative order, which
every rank must share.

Greedy choices can lose on some graphs, so `memory_schedule` returns the scheduled order only if
its lower bound (max live bytes over steps, with the same lifetime rules the planner uses) is
strictly below the original order's; otherwise the original order.
"""

from __future__ import annotations

from collections.abc import Mapping

from compiler.ir import Graph, Node, get_op

from .bounds import lower_bound
from .lifetimes import analyze_lifetimes, view_alias
from .sizes import DEFAULT_ALIGNMENT, SizeEnv, align_up, symbol_values


def memory_schedule(graph: Graph, sizes: Mapping[str, int] | None = None,
                    alignment: int = DEFAULT_ALIGNMENT) -> list[Node]:
    """The lower-peak of the original order and the greedy memory-aware order of `graph`."""
    scheduled = _Scheduler(graph, SizeEnv(symbol_values(graph, sizes)), alignment).run()
    if [id(n) for n in scheduled] == [id(n) for n in graph.nodes]:
        return list(graph.nodes)
    before = _bound(graph, graph.nodes, sizes, alignment)
    after = _bound(graph, scheduled, sizes, alignment)
    return scheduled if after < before else list(graph.nodes)


def _bound(graph: Graph, order, sizes, alignment: int) -> int:
    lifetimes = analyze_lifetimes(graph, sizes, alignment, order=order)
    return lower_bound(lifetimes.buffers, lifetimes.steps)


class _Scheduler:
    def __init__(self, graph: Graph, env: SizeEnv, alignment: int):
        self.graph = graph
        self.index = {id(n): i for i, n in enumerate(graph.nodes)}
        self.root, self.size = _storage(graph, env, alignment)
        self.readers: dict[int, int] = {}  # root id -> nodes still to read it
        self.deps: dict[int, list[Node]] = {}  # node id -> producer nodes it waits for
        self.users: dict[int, list[Node]] = {id(n): [] for n in graph.nodes}
        self.eager = {id(n) for n in graph.nodes if not any(v is not None for v in n.inputs)}
        self._build_edges()

    def _build_edges(self) -> None:
        previous_collective = None
        for node in self.graph.nodes:
            producers = {id(v.producer): v.producer for v in node.inputs
                         if v is not None and v.producer is not None}
            if get_op(node.op).kind == "collective":
                if previous_collective is not None:
                    producers[id(previous_collective)] = previous_collective
                previous_collective = node
            self.deps[id(node)] = list(producers.values())
            for p in producers.values():
                self.users[id(p)].append(node)
            for r in self._roots_read(node):
                self.readers[r] = self.readers.get(r, 0) + 1

    def _roots_read(self, node: Node) -> set[int]:
        return {self.root[id(v)] for v in node.inputs if v is not None and id(v) in self.root}

    def run(self) -> list[Node]:
        waiting = {id(n): sum(1 for p in self.deps[id(n)] if id(p) not in self.eager)
                   for n in self.graph.nodes}
        ready = [n for n in self.graph.nodes if waiting[id(n)] == 0 and id(n) not in self.eager]
        done: set[int] = set()
        order: list[Node] = []
        while ready:
            node = min(ready, key=lambda n: (self._growth(n, done), self.index[id(n)]))
            ready.remove(node)
            for p in self.deps[id(node)]:
                if id(p) in self.eager and id(p) not in done:
                    self._emit(p, order, done)
            self._emit(node, order, done)
            for user in self.users[id(node)]:
                waiting[id(user)] -= 1
                if waiting[id(user)] == 0:
                    ready.append(user)
        for node in self.graph.nodes:  # operand-free nodes nobody reads (graph outputs)
            if id(node) not in done:
                self._emit(node, order, done)
        return order

    def _emit(self, node: Node, order: list[Node], done: set[int]) -> None:
        order.append(node)
        done.add(id(node))
        for r in self._roots_read(node):
            self.readers[r] -= 1

    def _growth(self, node: Node, done: set[int]) -> int:
        """Bytes live after running `node` (and its pending operand-free producers) minus before."""
        grow = sum(self._allocates(p) for p in self.deps[id(node)]
                   if id(p) in self.eager and id(p) not in done)
        grow += self._allocates(node)
        for r in self._roots_read(node):
            if self.readers[r] == 1:
                grow -= self.size.get(r, 0)
        return grow

    def _allocates(self, node: Node) -> int:
        return sum(self.size.get(id(v), 0) for v in node.outputs
                   if self.root.get(id(v)) == id(v))


def _storage(graph: Graph, env: SizeEnv, alignment: int) -> tuple[dict[int, int], dict[int, int]]:
    """Value id -> id of the value owning its bytes (views share their source's, whatever the
    order); root id -> aligned bytes, for roots in the arena only."""
    external = {id(v) for v in (*graph.inputs, *graph.weights.values(), *graph.outputs)}
    root: dict[int, int] = {id(v): id(v) for v in (*graph.inputs, *graph.weights.values())}
    size: dict[int, int] = {}
    for node in graph.nodes:
        for v in node.outputs:
            source = node.inputs[0] if node.inputs else None
            if id(v) not in external and source is not None and id(source) in root \
                    and view_alias(node, env) is not None:
                root[id(v)] = root[id(source)]
                continue
            root[id(v)] = id(v)
            if id(v) not in external:
                size[id(v)] = align_up(env.nbytes(v.type), alignment)
    return root, size


def reorder(graph: Graph, order: list[Node]) -> bool:
    """Adopt `order` as the graph's node order; True if that changed it."""
    changed = [id(n) for n in order] != [id(n) for n in graph.nodes]
    if changed:
        graph.nodes = list(order)
    return changed


