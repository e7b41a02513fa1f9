"""Converters for reductions, the softmax family, cumsum, arg-reductions and topk."""

from __future__ import annotations

from compiler.ir import DType, Node
from compiler.ir.symbolic import product

from .builder import ONNX_DTYPES, Builder
from .convert_elementwise import Converter, in_dtype

REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "amax": "ReduceMax", "amin": "ReduceMin",
          "prod": "ReduceProd"}
ANY_ALL = {"any": "ReduceMax", "all": "ReduceMin"}


def _axes(b: Builder, dims) -> str | None:
    """The axes input of an ONNX reduction; absent (reduce every axis) when `dims` is empty."""
    return b.ints(list(dims)) if dims else None


def reduce(b: Builder, node: Node, x: list) -> list:
    if node.inputs[0].type.rank == 0:
        return [b.op1("Identity", x)]
    return [b.op1(REDUCE[node.op], [x[0], _axes(b, node.attrs["dims"])],
                  keepdims=int(node.attrs["keepdim"]))]


def any_all(b: Builder, node: Node, x: list) -> list:
    """Truth values as int32 0/1 (nonzero is true), reduced by max (any) or min (all)."""
    v = x[0]
    if in_dtype(node) != DType.bool:
        v = b.op1("Cast", [v], to=ONNX_DTYPES[DType.bool])
    v = b.op1("Cast", [v], to=ONNX_DTYPES[DType.i32])
    if node.inputs[0].type.rank:
        v = b.op1(ANY_ALL[node.op], [v, _axes(b, node.attrs["dims"])],
                  keepdims=int(node.attrs["keepdim"]))
    return [b.op1("Cast", [v], to=ONNX_DTYPES[DType.bool])]


def var(b: Builder, node: Node, x: list) -> list:
    """Two-pass variance (mean first), divided by N - correction like torch."""
    shape, dims = node.inputs[0].type.shape, node.attrs["dims"]
    dtype = in_dtype(node)
    axes = _axes(b, dims)
    mean = b.op1("ReduceMean", [x[0], axes], keepdims=1)
    diff = b.op1("Sub", [x[0], mean])
    total = b.op1("ReduceSum", [b.op1("Mul", [diff, diff]), axes],
                  keepdims=int(node.attrs["keepdim"]))
    rank = len(shape)
    count = product(shape[d % rank] for d in dims) if dims else product(shape)
    if isinstance(count, int):
        denom = b.const(float(count - node.attrs["correction"]), dtype)
    else:
        n = b.op1("Cast", [b.scalar_dim(count)], to=ONNX_DTYPES[dtype])
        denom = b.op1("Sub", [n, b.const(float(node.attrs["correction"]), dtype)])
    return [b.op1("Div", [total, denom])]


def arg_reduce(b: Builder, node: Node, x: list) -> list:
    op_type = {"argmax": "ArgMax", "argmin": "ArgMin"}[node.op]
    dim, keep = node.attrs["dim"], node.attrs["keepdim"]
    if dim is not None:
        return [b.op1(op_type, x, axis=dim, keepdims=int(keep))]
    flat = b.op1(op_type, [b.op1("Reshape", [x[0], b.ints([-1])])], axis=0, keepdims=0)
    if keep:  # torch keeps every axis as size 1 when reducing the flattened tensor
        return [b.op1("Reshape", [flat, b.ints([1] * node.inputs[0].type.rank)])]
    return [flat]


def softmax(b: Builder, node: Node, x: list) -> list:
    op_type = {"softmax": "Softmax", "log_softmax": "LogSoftmax"}[node.op]
    return [b.op1(op_type, x, axis=node.attrs["dim"])]


def cumsum(b: Builder, node: Node, x: list) -> list:
    if node.inputs[0].type.rank == 0:  # ONNX's CumSum refuses a scalar; its sum is itself
        return [b.op1("Identity", [x[0]])]
    return [b.op1("CumSum", [x[0], b.const(node.attrs["dim"], DType.i64)])]


def topk(b: Builder, node: Node, x: list) -> list:
    attrs = node.attrs
    return b.op("TopK", [x[0], b.dims([attrs["k"]])], 2, axis=attrs["dim"],
                largest=int(attrs["largest"]), sorted=int(attrs["sorted"]))


def table() -> dict[str, Converter]:
    entries: dict[str, Converter] = {name: reduce for name in REDUCE}
    entries.update({name: any_all for name in ANY_ALL})
    entries.update(var=var, argmax=arg_reduce, argmin=arg_reduce, softmax=softmax,
                   log_softmax=softmax, cumsum=cumsum, topk=topk)
    return entries
