"""The `op` a rewrite function builds with: real IR nodes, placed before the match's root."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compiler.ir import Graph, Node, TensorType, Value, get_op
from compiler.ir.ops.fused import Emitter


class RewriteBuilder(Emitter):
    """`op.rms_norm(x, w, normalized_shape=[64], eps=1e-6)` adds a node before the anchor, with
    the anchor's source location; `op.weight(...)` adds a weight computed at compile time."""

    def __init__(self, graph: Graph, anchor: Node):
        super().__init__(graph, before=anchor, loc=anchor.loc)
        self.anchor = anchor

    def __getattr__(self, name: str) -> Callable[..., Value]:
        if name.startswith("_"):
            raise AttributeError(name)
        get_op(name)

        def build(*inputs: Value | None, **attrs: Any) -> Value:
            return self.op(name, *inputs, **attrs)
        return build

    def weight(self, name: str, data: Any, type: TensorType) -> Value:
        """A new weight holding `data` (a tensor), named `name` or a numbered variant of it."""
        unique, suffix = name, 1
        while unique in self.graph.weights:
            unique, suffix = f"{name}_{suffix}", suffix + 1
        return self.graph.add_weight(unique, type, data)
