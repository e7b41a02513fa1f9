"""The builder the ATen converters write IR through.

One `AtenEmitter` serves a whole conversion; before each FX node the walker points it at that node
(`begin`), so every IR node a converter adds carries the node's source location, and converters
can read what torch computed for the node (`out_dtype`, `out_shape`) instead of re-deriving
torch's type promotion and shape arithmetic. Scalars become 0-d `constant` nodes and mixed dtypes
get explicit `cast` nodes here, so that IR binary ops always see operands of one dtype.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from compiler.ir import DType, Graph, Value
from compiler.ir.symbolic import Dim

from .symbols import SymbolMap


class Unsupported(Exception):
    """A node the IR cannot express (as called); the message says why, for the user."""


def ir_dtype(dtype: torch.dtype) -> DType:
    try:
        return DType.from_torch(dtype)
    except TypeError:
        raise Unsupported(f"dtype {dtype} has no IR equivalent") from None


class AtenEmitter:
    """Adds IR nodes for the FX node being converted; see the module docstring."""

    def __init__(self, graph: Graph, symbols: SymbolMap):
        self.graph = graph
        self.symbols = symbols
        self.loc: str | None = None
        self.hint: str | None = None
        self.val: Any = None
        self.created: list[tuple[str, Value]] = []

    def begin(self, name: str, loc: str | None, val: Any) -> None:
        self.hint, self.loc, self.val = name, loc, val
        self.created = []

    def finish(self, result: Any) -> None:
        """Name the node's results after the FX node (`view`), helpers after it and their op."""
        results = result if isinstance(result, (tuple, list)) else (result,)
        index = {id(v): i for i, v in enumerate(results) if isinstance(v, Value)}
        for op, value in self.created:
            if id(value) not in index:
                value.name = self.graph.fresh_name(f"{self.hint}_{op}")
            elif len(results) == 1:
                value.name = self.graph.fresh_name(self.hint)
            else:
                value.name = self.graph.fresh_name(f"{self.hint}_{index[id(value)]}")

    def abandon(self) -> None:
        """Take out the nodes a failed converter made before it failed: the partial export
        (coverage's table) counts the graph's ops, and those half-built nodes are not the
        model's."""
        made = dict.fromkeys(v.producer for _, v in self.created if v.producer is not None)
        self.graph.remove_nodes(made)
        self.created = []

    # -- what torch computed for the current node ------------------------------------------------
    def _out(self, index: int) -> torch.Tensor:
        val = self.val[index] if isinstance(self.val, (tuple, list)) else self.val
        if not isinstance(val, torch.Tensor):
            raise Unsupported("the result is not a tensor")
        return val

    def out_dtype(self, index: int = 0) -> DType:
        return ir_dtype(self._out(index).dtype)

    def out_shape(self, index: int = 0) -> list[Dim]:
        return [self.symbols.expr(d) for d in self._out(index).shape]

    # -- building ------------------------------------------------------------------------------
    def ops(self, op: str, *inputs: Value | None, **attrs: Any) -> list[Value]:
        node = self.graph.add_node(op, inputs, attrs, loc=self.loc)
        self.created.extend((op, value) for value in node.outputs)
        return node.outputs

    def op(self, op: str, *inputs: Value | None, **attrs: Any) -> Value:
        return self.ops(op, *inputs, **attrs)[0]

    def const(self, value: Any, dtype: DType) -> Value:
        return self.op("constant", value=scalar_value(value, dtype), dtype=dtype)

    def cast(self, value: Value, dtype: DType) -> Value:
        return value if value.dtype == dtype else self.op("cast", value, dtype=dtype)

    def tensor(self, x: Value | Any, dtype: DType) -> Value:
        """A Value of `dtype`: casts a Value, makes a 0-d constant of a Python or size scalar."""
        if isinstance(x, Value):
            return self.cast(x, dtype)
        return self.const(x, dtype)

    def result_type(self, a: Value | Any, b: Value | Any) -> DType:
        """torch's promoted dtype of two operands (0-d tensors and scalars weigh less)."""
        return ir_dtype(torch.result_type(_stand_in(a), _stand_in(b)))


def _stand_in(x: Value | Any):
    """What torch.result_type needs to know about an operand: dtype, rank 0 or not, or a scalar."""
    if isinstance(x, Value):
        return torch.empty((1,) * x.type.rank, dtype=x.dtype.to_torch(), device="meta")
    if isinstance(x, sympy.Basic):
        return 1 if x.is_integer else 1.0
    return x


def scalar_value(value: Any, dtype: DType) -> Any:
    """A constant's attribute value: a Python number of the dtype's kind, or a size expression."""
    if isinstance(value, sympy.Basic):
        if not value.is_integer:
            raise Unsupported(f"a non-integer size expression ({value}) is used as a scalar")
        return value
    if dtype == DType.bool:
        return bool(value)
    if dtype.is_float:
        return float(value)
    return int(value)
