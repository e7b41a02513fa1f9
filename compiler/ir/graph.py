"""The IR: a typed SSA graph of `Node`s over `Value`s.

Kept as small as tinygrad's UOp: a node is an op name, its input values, attributes and output
values; everything an op *means* (signature, shape rule, reference semantics) lives in the op
table (`compiler.ir.ops`), not here. Nodes are stored in execution order, which is always a
topological order; passes may reorder but never break that.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from .analysis import cached
from .types import TensorType


class Value:
    """An SSA value: a graph input, a weight, or an output of exactly one node."""

    __slots__ = ("name", "type", "producer")

    def __init__(self, name: str, type: TensorType, producer: Node | None = None):
        self.name = name
        self.type = type
        self.producer = producer

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
        self.inputs = inputs
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
    """

    def __init__(self, name: str = "main"):
        self.name = name
        self.symbols: dict[str, tuple[int, int | None]] = {}
        self.inputs: list[Value] = []
        self.weights: dict[str, Value] = {}
        self.nodes: list[Node] = []
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
        node = Node(op, inputs, attrs, outputs, loc)
        if before is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(self.nodes.index(before), node)
        self.version += 1
        return node

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"value name {name} is already used")
        self._names.add(name)
        return name

    # -- queries ------------------------------------------------------------------------------
    def users(self) -> dict[Value, list[Node]]:
        """Map from each value to the nodes that read it (graph outputs are not nodes)."""
        table: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                if value is not None:
                    table.setdefault(value, []).append(node)
        return table

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
    def replace_uses(self, old: Value, new: Value) -> None:
        """Point every reader of `old` (nodes and graph outputs) at `new`."""
        for node in self.nodes:
            node.inputs = [new if v is old else v for v in node.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]
        self.version += 1

    def remove_nodes(self, doomed: Iterable[Node]) -> None:
        doomed_ids = {id(n) for n in doomed}
        self.nodes = [n for n in self.nodes if id(n) not in doomed_ids]
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
