"""Shape and dtype rules shared by the op tables; each returns the list of output types."""

from __future__ import annotations

from ..dtypes import DType
from ..symbolic import Dim, equal, normalize, product
from ..types import TensorType
from .registry import ShapeError


def norm_axis(axis: int, rank: int) -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    if a == 1:
        return b
    if b == 1 or a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"cannot broadcast {a} with {b}")
    if equal(a, b):
        return a
    # torch.export only emits such pairs after proving them equal at trace time
    return b if isinstance(a, int) else a


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for shape in shapes:
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        out = [broadcast_dim(o, d) for o, d in zip(out, padded)]
    return tuple(out)


def same_dtype(types: list[TensorType], what: str) -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"{what} needs operands of one dtype, got {sorted(map(str, dtypes))}; "
                         "insert a cast")
    return dtypes.pop()


def unary(types, attrs):
    return [types[0]]


def unary_to(dtype: DType):
    def rule(types, attrs):
        return [types[0].with_dtype(dtype)]
    return rule


def cast(types, attrs):
    return [types[0].with_dtype(attrs["dtype"])]


def binary(types, attrs):
    dtype = same_dtype(types, "elementwise op")
    return [TensorType(dtype, broadcast_shapes(*(t.shape for t in types)))]


def compare(types, attrs):
    same_dtype(types, "comparison")
    return [TensorType(DType.bool, broadcast_shapes(*(t.shape for t in types)))]


def where(types, attrs):
    cond, a, b = types
    if cond.dtype != DType.bool:
        raise ShapeError(f"where needs a bool condition, got {cond.dtype}")
    dtype = same_dtype([a, b], "where")
    return [TensorType(dtype, broadcast_shapes(cond.shape, a.shape, b.shape))]


def reduced_shape(shape, dims, keepdim: bool):
    rank = len(shape)
    axes = {norm_axis(d, rank) for d in dims} if dims else set(range(rank))
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def accumulated(dtype: DType) -> DType:
    """torch sums and multiplies integers and bools in i64 (aten's default for sum/prod/cumsum)."""
    return dtype if dtype.is_float else DType.i64


def reduce(dtype: DType | None = None, accumulate: bool = False):
    def rule(types, attrs):
        shape = reduced_shape(types[0].shape, attrs["dims"], attrs["keepdim"])
        out = dtype or (accumulated(types[0].dtype) if accumulate else types[0].dtype)
        return [TensorType(out, shape)]
    return rule


def cumulative(types, attrs):
    return [types[0].with_dtype(accumulated(types[0].dtype))]


def arg_reduce(types, attrs):
    dim = attrs["dim"]
    dims = [] if dim is None else [dim]
    return [TensorType(DType.i64, reduced_shape(types[0].shape, dims, attrs["keepdim"]))]


def matmul_shape(a: tuple, b: tuple) -> tuple:
    if not a or not b:
        raise ShapeError("matmul needs operands of rank >= 1")
    a2 = a if len(a) > 1 else (1,) + a
    b2 = b if len(b) > 1 else b + (1,)
    if not equal(a2[-1], b2[-2]):
        raise ShapeError(f"matmul contraction mismatch: {a2[-1]} vs {b2[-2]}")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def matmul(types, attrs):
    dtype = same_dtype(types, "matmul")
    return [TensorType(dtype, matmul_shape(types[0].shape, types[1].shape))]


def linear(types, attrs):
    x, w, bias = types
    dtype = same_dtype([t for t in types if t is not None], "linear")
    if w.rank != 2 or not equal(x.shape[-1], w.shape[1]):
        raise ShapeError(f"linear: input features {x.shape[-1]} vs weight {list(w.shape)}")
    if bias is not None and (bias.rank != 1 or not equal(bias.shape[0], w.shape[0])):
        raise ShapeError(f"linear: bias {list(bias.shape)} vs weight {list(w.shape)}")
    return [TensorType(dtype, x.shape[:-1] + (w.shape[0],))]


def numel(shape) -> Dim:
    return normalize(product(shape))
