"""The pieces of a mixture-of-experts layer in standard ONNX ops: sort, index_put, grouped_matmul.

- `sort`: TopK over the whole axis. ONNX Runtime's TopK puts equal elements in index order, the
  IR's stable order, for both directions.
- `index_put`: ScatterND with the index tensors broadcast and stacked (`reduction="add"` when it
  accumulates), for indices on the leading axes (`LIMITS` refuses the rest).
- `grouped_matmul`: each row's group is the number of offsets at or below its row number; the
  row is multiplied by that group's weight (Gather, then a batched MatMul of one row each); rows
  past the last offset are zero. This is the op's exact meaning, but it materialises one weight
  matrix per row: the fused `moe` op is the fast path (com.microsoft.MoE, see convert_moe).
"""

from __future__ import annotations

from compiler.ir import DType, Node
from compiler.ir.ops.shape_rules import broadcast_shapes

from .builder import ONNX_DTYPES, Builder
from .convert_elementwise import Converter

I64 = ONNX_DTYPES[DType.i64]


def _as_i64(b: Builder, value, name: str) -> str:
    return name if value.type.dtype == DType.i64 else b.op1("Cast", [name], to=I64)


def sort(b: Builder, node: Node, x: list) -> list:
    src = node.inputs[0].type
    if src.rank == 0:
        return [b.op1("Identity", [x[0]]), b.const(0, DType.i64)]
    dim = node.attrs["dim"] % src.rank
    return b.op("TopK", [x[0], b.dims([src.shape[dim]])], 2, axis=dim,
                largest=int(node.attrs["descending"]), sorted=1)


def index_put_fits(node: Node) -> str | None:
    indices = node.inputs[2:]
    if any(v is None for v in indices):
        return "index_put with an index on a later axis only (x[:, i] = v)"
    return None


def index_put(b: Builder, node: Node, x: list) -> list:
    indices = node.inputs[2:]
    target = node.inputs[0].type
    bshape = broadcast_shapes(*(v.type.shape for v in indices))
    shape = b.dims(bshape)
    cols = [b.op1("Unsqueeze", [b.op1("Expand", [_as_i64(b, v, name), shape]), b.ints([-1])])
            for v, name in zip(indices, x[2:])]
    where = cols[0] if len(cols) == 1 else b.op1("Concat", cols, axis=-1)
    values = b.op1("Expand", [x[1], b.dims([*bshape, *target.shape[len(indices):]])])
    reduction = "add" if node.attrs["accumulate"] else None
    return [b.op1("ScatterND", [x[0], where, values], reduction=reduction)]


def grouped_matmul(b: Builder, node: Node, x: list) -> list:
    rows, groups = node.inputs[0].type.shape[0], node.inputs[1].type.shape[0]
    row = b.op1("Range", [b.const(0, DType.i64), b.scalar_dim(rows), b.const(1, DType.i64)])
    offsets = b.op1("Unsqueeze", [_as_i64(b, node.inputs[2], x[2]), b.ints([0])])
    at_or_below = b.op1("GreaterOrEqual", [b.op1("Unsqueeze", [row, b.ints([1])]), offsets])
    group = b.op1("ReduceSum", [b.op1("Cast", [at_or_below], to=I64), b.ints([1])], keepdims=0)
    last = b.scalar_dim(groups - 1) if not isinstance(groups, int) else b.const(groups - 1,
                                                                                  DType.i64)
    weights = b.op1("Gather", [x[1], b.op1("Min", [group, last])], axis=0)
    product = b.op1("MatMul", [b.op1("Unsqueeze", [x[0], b.ints([1])]), weights])
    product = b.op1("Squeeze", [product, b.ints([1])])
    inside = b.op1("Unsqueeze", [b.op1("LessOrEqual", [group, last]), b.ints([1])])
    zero = b.const(0.0, node.inputs[0].type.dtype)
    return [b.op1("Where", [inside, product, zero])]


def table() -> dict[str, Converter]:
    return {"sort": sort, "index_put": index_put, "grouped_matmul": grouped_matmul}
