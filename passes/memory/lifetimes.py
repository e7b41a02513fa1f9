"""Lifetime analysis: the buffers a run needs, their sizes, and the steps each one is live.

Step i is the i-th node of `graph.nodes` (the execution order). A buffer is allocated by the node
that writes its root value and is live from that step through the last step that reads the root
or any value sharing it; operands and results of one node are live together at its step.

Kept out of the arena (`external`): graph inputs and weights (owned by the caller and the
artifact), graph outputs (returned to the caller, so they must outlive the run) and views of any
of those. Sharing a buffer (`Alias`) is decided by what the executors really do — every value in
the arena is one contiguous row-major byte range, which every backend can address:

* view ops whose result is a contiguous part of their source's bytes (`VIEW_ALIASES`): `reshape`
  always (its source is contiguous); `slice` with step 1 and `select`, when every dim before the
  sliced one is 1 (the result is one byte range, at an offset); `expand` and `permute` only when
  they keep the element order (they add or move size-1 dims). Any other view (a real transpose,
  a broadcast, a strided slice) is materialised by the executor into a buffer of its own.
* in-place results: an elementwise op whose result has the shape and element size of an operand
  that dies at this step (no value sharing its buffer is read later) writes over that operand.
  This is safe for a kernel that reads element i before writing element i, and for the reference
  executor, which computes a result before copying it into its slot. Another operand of the same
  node may share the buffer only with the same layout, so no element is read after it is written.

A graph output is never an alias: a view of an intermediate that the caller receives is copied
out when it is produced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from compiler.ir import Graph, Node, Value, get_op

from .plan import Alias
from .sizes import DEFAULT_ALIGNMENT, SizeEnv, align_up, symbol_values


@dataclass(frozen=True)
class Buffer:
    """One allocation: the root value, its reserved and needed bytes, its live steps."""

    value: str
    size: int
    nbytes: int
    first: int
    last: int


@dataclass(frozen=True)
class Lifetimes:
    buffers: tuple[Buffer, ...]   # ordered by first step, then by output position
    aliases: tuple[Alias, ...]
    external: tuple[str, ...]     # node outputs kept out of the arena
    steps: int
    sizes: Mapping[str, int]
    alignment: int
    inplace: bool


# -- view aliases: op -> byte offset of the result inside its source, or None --------------------

ViewRule = Callable[[Node, SizeEnv], "int | None"]


def _whole(node: Node, env: SizeEnv) -> int | None:
    return 0


def _same_order(node: Node, env: SizeEnv) -> int | None:
    """expand / permute that only add or move size-1 dims keep the bytes in place."""
    src, out = node.inputs[0].type.shape, node.output.type.shape
    if node.op == "permute":
        order = [d % len(src) for d in node.attrs["dims"]] if src else []
        moved = [d for d in order if src[d] != 1]
        return 0 if moved == sorted(moved) else None
    kept = [d for d in out if d != 1]
    return 0 if kept == [d for d in src if d != 1] else None


def _leading_part(node: Node, env: SizeEnv, index_attr: str) -> int | None:
    """slice (step 1) / select along a dim with only size-1 dims before it: one byte range."""
    x = node.inputs[0].type
    dim = node.attrs["dim"] % x.rank
    if node.attrs.get("step", 1) != 1 or any(d != 1 for d in x.shape[:dim]):
        return None
    size = env.dim(x.shape[dim])
    start = env.dim(node.attrs[index_attr])
    start = start + size if start < 0 else min(start, size)
    inner = 1
    for d in x.shape[dim + 1:]:
        inner *= env.dim(d)
    return start * inner * x.dtype.itemsize


VIEW_ALIASES: dict[str, ViewRule] = {
    "reshape": _whole,
    "expand": _same_order,
    "permute": _same_order,
    "slice": lambda node, env: _leading_part(node, env, "start"),
    "select": lambda node, env: _leading_part(node, env, "index"),
}


def view_alias(node: Node, env: SizeEnv) -> int | None:
    """Byte offset of a view node's result inside its operand, or None if it must be copied."""
    rule = VIEW_ALIASES.get(node.op)
    if rule is None or len(node.outputs) != 1 or node.inputs[0] is None:
        return None
    return rule(node, env)


# -- the analysis --------------------------------------------------------------------------------

def analyze_lifetimes(graph: Graph, sizes: Mapping[str, int] | None = None,
                      alignment: int = DEFAULT_ALIGNMENT, inplace: bool = True,
                      order: Sequence[Node] | None = None) -> Lifetimes:
    """Buffers, aliases and external values of `graph` in its node order (or in `order`, a
    topological order of the same nodes, to judge a schedule before adopting it).

    `sizes` gives symbol values (default: every symbol at its upper bound); `inplace` allows
    elementwise results to reuse a dying operand's buffer.
    """
    env = SizeEnv(symbol_values(graph, sizes))
    nodes = list(graph.nodes if order is None else order)
    return _Analysis(graph, nodes, env, alignment, inplace).run()


class _Analysis:
    def __init__(self, graph: Graph, nodes: list[Node], env: SizeEnv, alignment: int,
                 inplace: bool):
        self.graph, self.nodes, self.env = graph, nodes, env
        self.alignment, self.inplace = alignment, inplace
        self.last_use = _last_uses(nodes)
        self.outputs = {id(v) for v in graph.outputs}
        # value id -> (root value, byte offset in root); roots map to themselves
        self.root: dict[int, tuple[Value, int]] = {}
        self.external_roots = {id(v) for v in (*graph.inputs, *graph.weights.values())}
        self.group_last: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self.order: list[Value] = []
        self.aliases: list[Alias] = []
        self.external: list[str] = []
        self._nbytes: dict[int, int] = {}

    def nbytes(self, value: Value) -> int:
        size = self._nbytes.get(id(value))
        if size is None:
            size = self._nbytes[id(value)] = self.env.nbytes(value.type)
        return size

    def run(self) -> Lifetimes:
        for step, node in enumerate(self.nodes):
            for value in node.outputs:
                self._place(step, node, value)
        buffers = []
        for v in self.order:
            nbytes = self.nbytes(v)
            buffers.append(Buffer(v.name, align_up(nbytes, self.alignment), nbytes,
                                  self.first[id(v)], self.group_last[id(v)]))
        return Lifetimes(tuple(buffers), tuple(self.aliases), tuple(self.external),
                         len(self.nodes), dict(self.env.values), self.alignment,
                         self.inplace)

    def _place(self, step: int, node: Node, value: Value) -> None:
        last = max(step, self.last_use.get(id(value), step))
        if id(value) in self.outputs:
            self.external.append(value.name)
            self.root[id(value)] = (value, 0)
            self.external_roots.add(id(value))
            return
        offset = view_alias(node, self.env)
        if offset is not None:
            root, base = self.root.get(id(node.inputs[0]), (node.inputs[0], 0))
            self._join(value, root, base + offset, "view", last)
            return
        source = self._inplace_source(step, node, value) if self.inplace else None
        if source is not None:
            self._join(value, self.root[id(source)][0], 0, "inplace", last)
            return
        self.root[id(value)] = (value, 0)
        self.first[id(value)] = step
        self.group_last[id(value)] = last
        self.order.append(value)

    def _join(self, value: Value, root: Value, offset: int, kind: str, last: int) -> None:
        self.root[id(value)] = (root, offset)
        if id(root) in self.external_roots:
            self.external.append(value.name)
            return
        self.aliases.append(Alias(value.name, root.name, offset, kind))
        self.group_last[id(root)] = max(self.group_last[id(root)], last)

    def _inplace_source(self, step: int, node: Node, value: Value) -> Value | None:
        """The operand whose buffer `value` may overwrite, if any (see the module docstring)."""
        if get_op(node.op).kind != "elementwise" or len(node.outputs) != 1:
            return None
        for operand in node.inputs:
            if operand is None or id(operand) not in self.root:
                continue
            root, offset = self.root[id(operand)]
            if id(root) in self.external_roots or offset != 0 or \
                    self.group_last[id(root)] != step:
                continue
            if operand.type.shape != value.type.shape or \
                    operand.type.dtype.itemsize != value.type.dtype.itemsize:
                continue
            if self.nbytes(operand) != self.nbytes(root):
                continue
            if all(self._same_layout(other, root, operand) for other in node.inputs):
                return operand
        return None

    def _same_layout(self, other: Value | None, root: Value, operand: Value) -> bool:
        if other is None or self.root.get(id(other), (None, 0))[0] is not root:
            return True
        return self.root[id(other)][1] == 0 and other.type.shape == operand.type.shape


def _last_uses(nodes: Sequence[Node]) -> dict[int, int]:
    last: dict[int, int] = {}
    for step, node in enumerate(nodes):
        for v in node.inputs:
            if v is not None:
                last[id(v)] = step
    return last
