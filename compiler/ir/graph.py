"""The IR: a typed SSA graph of `Node`s over `Value`s.

Kept as small as tinygrad's UOp: a node is an op name, its input values, attributes and output
values; everything an op *means* (signature, shape rule, reference semantics) lives in the op
table (`compiler.ir.ops`), not here. Nodes are stored in execution order, which is always a
topological order; passes may reorder but never break that.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any

from .analysis import cached
from .types import TensorType

# The spacing of fresh order keys: room for ~40 insertions at one place before a renumbering.
_GAP = 1024.0


class Value:
    """An SSA value: a graph input, a weight, or an output of exactly one node.

    It knows its readers: `uses` lists the (node, operand index) pairs that read it, in the
    order they were made, kept current by the graph's mutation methods (`Graph.add_node`,
    `set_input`, `replace_uses`, `remove_nodes`, `set_nodes`), so a pass asks a value for its
    users instead of scanning the graph (the verifier checks they match the graph).
    """

    __slots__ = ("name", "type", "producer", "_uses")

    def __init__(self, name: str, type: TensorType, producer: Node | None = None):
        self.name = name
        self.type = type
        self.producer = producer
        self._uses: dict[tuple[Node, int], None] = {}

    @property
    def uses(self) -> list[tuple[Node, int]]:
        """(node, operand index) of every read, in the order the reads were made."""
        return list(self._uses)

    @property
    def users(self) -> list[Node]:
        """The nodes that read this value, each once (graph outputs are not nodes)."""
        if len(self._uses) < 2:
            return [node for node, _ in self._uses]
        return list(dict.fromkeys([node for node, _ in self._uses]))

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def shape(self):
        return self.type.shape

    def __repr__(self) -> str:
        return f"Value({self.name}: {self.type})"


class Node:
    """One op application. `inputs` may hold None for an absent optional operand."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "loc")

    def __init__(self, op: str, inputs: list[Value | None], attrs: dict[str, Any],
                 outputs: list[Value], loc: str | None = None):
        self.op = op
        self.inputs = list(inputs)
        self.attrs = attrs
        self.outputs = outputs
        self.loc = loc
        for out in outputs:
            out.producer = self

    @property
    def output(self) -> Value:
        """The single output of a one-output node."""
        if len(self.outputs) != 1:
            raise ValueError(f"{self.op} has {len(self.outputs)} outputs")
        return self.outputs[0]

    def __repr__(self) -> str:
        outs = ", ".join(v.name for v in self.outputs)
        ins = ", ".join("_" if v is None else v.name for v in self.inputs)
        return f"Node({outs} = {self.op}({ins}))"


class Graph:
    """A function: symbols with ranges, inputs, weights, nodes in execution order, outputs.

    `weight_data` maps weight names to tensors when they are known (after export or loading); the
    text form names weights by type only, so a parsed graph has declarations without data.

    Nodes change only through the mutation methods below (`add_node`/`insert_node`,
    `set_input`, `replace_uses`, `remove_nodes`, `set_nodes`, which `graph.nodes = ...` calls):
    they keep every value's use-list current. Each node also has an order key that grows along
    `nodes`, so finding a node's position (`index`) takes a bisection, not a scan: a rewrite
    that inserts or removes a few nodes costs the same in a graph of 100 or 100,000 nodes.
    """

    def __init__(self, name: str = "main"):
        self.name = name
        self.symbols: dict[str, tuple[int, int | None]] = {}
        self.inputs: list[Value] = []
        self.weights: dict[str, Value] = {}
        self._nodes: list[Node] = []
        self._keys: dict[Node, float] = {}
        self.outputs: list[Value] = []
        self.weight_data: dict[str, Any] = {}
        self._counter = itertools.count()
        self._names: set[str] = set()
        self.version = 0  # bumped by every mutation method: cached analyses compare it
        # named analyses (analysis.py): (name, options) -> (version computed at, result)
        self.analysis_cache: dict[tuple, tuple[int, Any]] = {}

    # -- construction -------------------------------------------------------------------------
    def fresh_name(self, hint: str | None = None) -> str:
        if hint and hint not in self._names:
            self._names.add(hint)
            return hint
        while True:
            name = f"{hint}_{next(self._counter)}" if hint else str(next(self._counter))
            if name not in self._names:
                self._names.add(name)
                return name

    def add_input(self, name: str, type: TensorType) -> Value:
        value = Value(self._claim(name), type)
        self.inputs.append(value)
        self.version += 1
        return value

    def add_weight(self, name: str, type: TensorType, data: Any = None) -> Value:
        if name in self.weights:
            raise ValueError(f"weight {name} declared twice")
        value = Value(name, type)
        self.weights[name] = value
        self.version += 1
        if data is not None:
            self.weight_data[name] = data
        return value

    def add_node(self, op: str, inputs: Iterable[Value | None],
                 attrs: Mapping[str, Any] | None = None,
                 output_types: list[TensorType] | None = None, loc: str | None = None,
                 names: list[str] | None = None, before: Node | None = None) -> Node:
        """Append (or insert before `before`) a node; output types default to the shape rule."""
        from .ops import get_op

        inputs = list(inputs)
        attrs = get_op(op).complete_attrs(dict(attrs or {}))
        if output_types is None:
            operand_types = [v.type if v is not None else None for v in inputs]
            output_types = get_op(op).infer(operand_types, attrs)
        names = names or [None] * len(output_types)
        outputs = [Value(self.fresh_name(n), t) for n, t in zip(names, output_types)]
        return self.insert_node(Node(op, inputs, attrs, outputs, loc), before)

    def insert_node(self, node: Node, before: Node | None = None) -> Node:
        """Place a built node at the end (or before `before`) and record what it reads."""
        index = len(self._nodes) if before is None else self.index(before)
        self._nodes.insert(index, node)
        self._place(index)
        for i, value in enumerate(node.inputs):
            if value is not None:
                value._uses[(node, i)] = None
        self.version += 1
        return node

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"value name {name} is already used")
        self._names.add(name)
        return name

    # -- order ------------------------------------------------------------------------------
    @property
    def nodes(self) -> list[Node]:
        """The nodes in execution order. Read it freely; change it only through the methods
        (assigning a new list calls `set_nodes`)."""
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: Iterable[Node]) -> None:
        self.set_nodes(nodes)

    def index(self, node: Node) -> int:
        """The position of `node` in `nodes` (ValueError when it is not there)."""
        key = self._keys.get(node)
        if key is None and len(self._keys) == len(self._nodes):
            raise ValueError(f"{node!r} is not in graph {self.name}")
        if key is not None:
            try:
                i = bisect_left(self._nodes, key, key=self._keys.__getitem__)
            except KeyError:  # a node placed without the methods: renumber below
                i = -1
            if 0 <= i < len(self._nodes) and self._nodes[i] is node:
                return i
        self._renumber()
        return self._nodes.index(node)

    def _place(self, index: int) -> None:
        """Give the node at `index` a key between its neighbours' (renumber when none fits)."""
        nodes, keys = self._nodes, self._keys
        prev = keys.get(nodes[index - 1]) if index > 0 else None
        after = keys.get(nodes[index + 1]) if index + 1 < len(nodes) else None
        if (index > 0 and prev is None) or (index + 1 < len(nodes) and after is None):
            self._renumber()
            return
        if prev is None:
            key = 0.0 if after is None else after - _GAP
        elif after is None:
            key = prev + _GAP
        else:
            key = (prev + after) / 2
            if not prev < key < after:  # the gap is used up: space every key out again
                self._renumber()
                return
        keys[nodes[index]] = key

    def _renumber(self) -> None:
        self._keys = {node: i * _GAP for i, node in enumerate(self._nodes)}

    # -- queries ------------------------------------------------------------------------------
    def users(self) -> Mapping[Value, list[Node]]:
        """Map from each value to the nodes that read it, in graph order, once per operand
        (graph outputs are not nodes); values nothing reads are not keys. A view over the
        use-lists: building it costs nothing, each lookup sorts that value's readers."""
        return _Users(self)

    def values(self) -> Iterable[Value]:
        yield from self.inputs
        yield from self.weights.values()
        for node in self.nodes:
            yield from node.outputs

    def is_weight(self, value: Value) -> bool:
        return self.weights.get(value.name) is value

    def analysis(self, name: str, **options: Any) -> Any:
        """The named analysis `name` of this graph (compiler.ir.analysis), computed once and
        cached until the graph changes."""
        return cached(self, name, options)

    # -- mutation -----------------------------------------------------------------------------
    def set_input(self, node: Node, index: int, value: Value | None) -> None:
        """Make operand `index` of `node` read `value` (None: an absent optional operand)."""
        old = node.inputs[index]
        if old is value:
            return
        if old is not None:
            old._uses.pop((node, index), None)
        node.inputs[index] = value
        if value is not None:
            value._uses[(node, index)] = None
        self.version += 1

    def replace_uses(self, old: Value, new: Value) -> None:
        """Point every reader of `old` (nodes and graph outputs) at `new`."""
        if old is new:
            return
        for node, index in list(old._uses):
            self.set_input(node, index, new)
        if any(v is old for v in self.outputs):
            self.outputs = [new if v is old else v for v in self.outputs]
            self.version += 1

    def remove_nodes(self, doomed: Iterable[Node]) -> None:
        """Take nodes out (their reads with them); nodes not in the graph are ignored."""
        doomed = list(dict.fromkeys(doomed))
        if len(doomed) > 16 and len(doomed) * 8 > len(self._nodes):
            gone = set(doomed)
            self.set_nodes([n for n in self._nodes if n not in gone])
            return
        for node in doomed:
            try:
                index = self.index(node)
            except ValueError:
                continue
            del self._nodes[index]
            del self._keys[node]
            for i, value in enumerate(node.inputs):
                if value is not None:
                    value._uses.pop((node, i), None)
            self.version += 1

    def set_nodes(self, nodes: Iterable[Node]) -> None:
        """Replace the node list: a new order, with nodes dropped (their reads go) or added
        (their reads are recorded). One pass over the graph, for passes that rebuild the whole
        order anyway (dead code, CSE, scheduling)."""
        nodes = list(nodes)
        old, new = set(self._nodes), set(nodes)
        for node in self._nodes:
            if node not in new:
                for i, value in enumerate(node.inputs):
                    if value is not None:
                        value._uses.pop((node, i), None)
        for node in nodes:
            if node not in old:
                for i, value in enumerate(node.inputs):
                    if value is not None:
                        value._uses[(node, i)] = None
        self._nodes = nodes
        self._renumber()
        self.version += 1

    def remove_unused_weights(self) -> bool:
        used = {v.name for n in self.nodes for v in n.inputs if v is not None}
        used |= {v.name for v in self.outputs}
        unused = [name for name in self.weights if name not in used]
        for name in unused:
            del self.weights[name]
            self.weight_data.pop(name, None)
        self.version += bool(unused)
        return bool(unused)

    def __repr__(self) -> str:
        return f"Graph({self.name}: {len(self.inputs)} inputs, {len(self.weights)} weights, " \
               f"{len(self.nodes)} nodes, {len(self.outputs)} outputs)"


class _Users(Mapping):
    """`Graph.users()`: value -> its reading nodes in graph order, read from the use-lists."""

    def __init__(self, graph: Graph):
        self._graph = graph

    def __getitem__(self, value: Value) -> list[Node]:
        found = []
        for node, index in value._uses:
            try:
                found.append((self._graph.index(node), index, node))
            except ValueError:  # a reader in another graph
                continue
        if not found:
            raise KeyError(value)
        found.sort(key=lambda use: use[:2])
        return [node for _, _, node in found]

    def __iter__(self):
        return (value for value in self._graph.values() if value in self)

    def __contains__(self, value: object) -> bool:
        try:
            self[value]
        except (KeyError, AttributeError):
            return False
        return True

    def __len__(self) -> int:
        return sum(1 for _ in self)
