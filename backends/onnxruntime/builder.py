"""The ONNX graph under construction while one IR graph is lowered.

Converters (see `op_table`) never touch protobufs directly: they call `Builder.op` to append an
ONNX node and get its output names, `Builder.const` for small constants (deduplicated
initializers stored inside model.onnx), and `Builder.dims` for shape vectors whose entries may be
symbolic. The builder also remembers which ONNX ops each IR node became, for `dayzero inspect`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from compiler.ir import DType, Node
from compiler.ir.symbolic import Dim

from .probe import KernelSet
from .symdims import SymbolSource, as_int64_scalar, emit_dims

# IR dtype -> ONNX element type.
ONNX_DTYPES: dict[DType, int] = {
    DType.f64: TensorProto.DOUBLE, DType.f32: TensorProto.FLOAT, DType.f16: TensorProto.FLOAT16,
    DType.bf16: TensorProto.BFLOAT16, DType.f8e4m3: TensorProto.FLOAT8E4M3FN,
    DType.f8e5m2: TensorProto.FLOAT8E5M2, DType.i64: TensorProto.INT64,
    DType.i32: TensorProto.INT32, DType.i16: TensorProto.INT16, DType.i8: TensorProto.INT8,
    DType.u8: TensorProto.UINT8, DType.bool: TensorProto.BOOL,
}


class Builder:
    """Accumulates ONNX nodes and constant initializers, handing out unique value names."""

    def __init__(self, sources: Mapping[str, SymbolSource], kernels: KernelSet,
                 reserved: Sequence[str] = ()):
        self.kernels = kernels  # what the target ONNX Runtime can run (fused variants ask)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.opsets: dict[str, int] = {}
        self.sources = dict(sources)
        self._used: set[str] = set(reserved)
        self._consts: dict[tuple, str] = {}
        self._dims: dict[Any, str] = {}
        self._memo: dict[Any, Any] = {}
        self._counter = 0
        self._current_start = 0
        self.node_ops: list[list[str]] = []
        # IR value (by id) -> the ONNX name holding it, filled in by the lowering as it goes: a
        # converter may read a value its node does not take (a fused kernel that consumes the
        # tensor its inputs were sliced from)
        self.value_names: dict[int, str] = {}
        # what the graph knows beyond its nodes, for converters that compute at compile time
        self.symbol_ranges: Mapping[str, tuple[int, int | None]] = {}
        self.weight_data: Mapping[str, Any] = {}
        self.position_tables: Any = None  # the graph's `position_tables` analysis
        # graph weights by IR value id, and {(weight, layout): stored name} for the weights the
        # artifact also (or only) stores in a kernel's layout (see lower.derived_weights)
        self.weight_names: dict[int, str] = {}
        self.layouts: dict[tuple[str, str], str] = {}

    def stored_layout(self, value: Any, layout: str) -> str | None:
        """The initializer holding graph weight `value` in `layout`, when the artifact stores
        it so (a kernel then reads those bytes as they are); None otherwise."""
        return self.layouts.get((self.weight_names.get(id(value), ""), layout))

    # -- names ---------------------------------------------------------------------------------
    def fresh(self, hint: str = "t") -> str:
        while True:
            self._counter += 1
            name = f"_{hint}{self._counter}"
            if name not in self._used:
                self._used.add(name)
                return name

    def claim(self, name: str) -> str:
        """`name` itself when still free (IR value names), else a fresh variant of it."""
        if name not in self._used:
            self._used.add(name)
            return name
        return self.fresh(name)

    # -- nodes ---------------------------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str | None], outputs: int = 1,
           domain: str = "", unused: Sequence[int] = (), **attrs: Any) -> list[str]:
        """Append one ONNX node; absent optional inputs are None. Returns its output names.

        Outputs listed in `unused` are left unnamed, so ORT does not compute them.
        """
        names = ["" if i in unused else self.fresh() for i in range(outputs)]
        ins = ["" if i is None else i for i in inputs]
        while ins and ins[-1] == "":
            ins.pop()
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = helper.make_node(op_type, ins, names, name=self.fresh("n"), domain=domain or None,
                                **attrs)
        self.nodes.append(node)
        if domain:
            self.opsets.setdefault(domain, 1)
        return names

    def op1(self, op_type: str, inputs: Sequence[str | None], domain: str = "",
            **attrs: Any) -> str:
        """`op` for the common one-output case."""
        return self.op(op_type, inputs, 1, domain, **attrs)[0]

    # -- constants -----------------------------------------------------------------------------
    def const(self, value: Any, dtype: DType = DType.f32,
              shape: Sequence[int] | None = None) -> str:
        """A constant tensor (a scalar unless `shape` or `value` says otherwise), deduplicated."""
        array = np.asarray(value)
        dims = tuple(array.shape if shape is None else shape)
        flat = tuple(array.reshape(-1).tolist())
        key = (dtype, dims, flat, str(array.dtype))
        if key not in self._consts:
            name = self.fresh("c")
            vals = [float(v) if dtype.is_float else v for v in flat]
            if dtype == DType.bool:
                vals = [bool(v) for v in vals]
            self.initializers.append(helper.make_tensor(name, ONNX_DTYPES[dtype], dims, vals))
            self._consts[key] = name
        return self._consts[key]

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 constant (axes, static shapes)."""
        return self.const(np.asarray(list(values), dtype=np.int64), DType.i64)

    def dims(self, dims: Sequence[Dim]) -> str:
        """A 1-D int64 tensor holding `dims`; symbolic entries are computed from input shapes."""
        return emit_dims(self, list(dims), self._dims)

    def scalar_dim(self, dim: Dim) -> str:
        """A 0-d int64 tensor holding one (possibly symbolic) dim."""
        return as_int64_scalar(self, dim)

    def memo(self, key: Any, make) -> Any:
        """`make()` once per key: values derived from graph-level tensors (an attention mask
        shared by every layer) are built once and reused by every node that needs them."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # -- bookkeeping for inspect ---------------------------------------------------------------
    def begin(self, node: Node) -> None:
        """Start recording the ONNX nodes emitted for IR `node`."""
        self._current_start = len(self.nodes)

    def end(self) -> list[onnx.NodeProto]:
        """The ONNX nodes emitted for the current IR node, recorded for inspection."""
        emitted = self.nodes[self._current_start:]
        self.node_ops.append([qualified_op(n) for n in emitted])
        return emitted


def fill_value(value: Any, dtype: DType) -> onnx.TensorProto:
    """The one-element `value` attribute of ConstantOfShape."""
    vals = [bool(value)] if dtype == DType.bool else [float(value) if dtype.is_float else value]
    return helper.make_tensor("value", ONNX_DTYPES[dtype], [1], vals)


def qualified_op(node: onnx.NodeProto) -> str:
    return f"{node.domain}.{node.op_type}" if node.domain else node.op_type
