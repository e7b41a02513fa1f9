"""Converters for views, data movement, indexing and tensor creation.

Size attributes may be symbolic; they go through `Builder.dims`, which computes them from the
input shapes at run time, so these converters never assume a concrete size.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import DType, Node
from compiler.ir.ops.shape_rules import broadcast_shapes, norm_axis

from .builder import ONNX_DTYPES, Builder, fill_value
from .convert_elementwise import Converter, in_dtype, out_dtype

INT64_MIN = int(np.iinfo(np.int64).min)
# Trilu's CPU kernel covers these; other dtypes go through a Where on a bool triangle.
TRILU_DTYPES = {DType.f32, DType.f64, DType.i64, DType.bool}


def reshape(b: Builder, node: Node, x: list) -> list:
    shape = list(node.attrs["shape"])
    zero = any(isinstance(d, int) and d == 0 for d in shape)
    return [b.op1("Reshape", [x[0], b.dims(shape)], allowzero=1 if zero else None)]


def permute(b: Builder, node: Node, x: list) -> list:
    rank = node.inputs[0].type.rank
    return [b.op1("Transpose", x, perm=[norm_axis(d, rank) for d in node.attrs["dims"]])]


def expand(b: Builder, node: Node, x: list) -> list:
    """ONNX Expand broadcasts both ways, so torch's -1 ("keep this dim") is a 1 here."""
    shape = [1 if isinstance(d, int) and d == -1 else d for d in node.attrs["shape"]]
    return [b.op1("Expand", [x[0], b.dims(shape)])]


def slice_(b: Builder, node: Node, x: list) -> list:
    a = node.attrs
    return [b.op1("Slice", [x[0], b.dims([a["start"]]), b.dims([a["end"]]), b.ints([a["dim"]]),
                            b.ints([a["step"]])])]


def select(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Gather", [x[0], b.scalar_dim(node.attrs["index"])], axis=node.attrs["dim"])]


def concat(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Concat", x, axis=node.attrs["dim"])]


def gather(b: Builder, node: Node, x: list) -> list:
    return [b.op1("GatherElements", [x[0], _int64(b, node, 1, x[1])], axis=node.attrs["dim"])]


def index_select(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Gather", [x[0], _int64(b, node, 1, x[1])], axis=node.attrs["dim"])]


def index(b: Builder, node: Node, x: list) -> list:
    """numpy advanced indexing: Gather for one index tensor, else GatherND on moved axes.

    The indexed axes are transposed to the front, the broadcast index tensors stacked into a
    GatherND index, and the result's axes put where torch puts them: the broadcast index dims
    first when the indexed axes are apart, in place of the indexed axes when they are adjacent.
    """
    src = node.inputs[0].type
    present = [i for i, v in enumerate(node.inputs[1:]) if v is not None]
    if len(present) == 1:
        p = present[0]
        return [b.op1("Gather", [x[0], _int64(b, node, p + 1, x[p + 1])], axis=p)]
    rest = [i for i in range(src.rank) if i not in present]
    moved = b.op1("Transpose", [x[0]], perm=present + rest)
    bshape = broadcast_shapes(*(node.inputs[p + 1].type.shape for p in present))
    cols = [b.op1("Unsqueeze", [b.op1("Expand", [_int64(b, node, p + 1, x[p + 1]), b.dims(bshape)]),
                                b.ints([-1])]) for p in present]
    out = b.op1("GatherND", [moved, b.op1("Concat", cols, axis=-1)])
    adjacent = present == list(range(present[0], present[-1] + 1))
    if not adjacent or present[0] == 0:
        return [out]
    nb, lead = len(bshape), present[0]
    perm = list(range(nb, nb + lead)) + list(range(nb)) + list(range(nb + lead, nb + len(rest)))
    return [b.op1("Transpose", [out], perm=perm)]


def _int64(b: Builder, node: Node, i: int, name: str) -> str:
    if node.inputs[i].type.dtype == DType.i64:
        return name
    return b.op1("Cast", [name], to=ONNX_DTYPES[DType.i64])


def pad(b: Builder, node: Node, x: list) -> list:
    """torch lists (before, after) pairs from the last dim backwards; ONNX all begins, then ends."""
    rank, pads = node.inputs[0].type.rank, list(node.attrs["pads"])
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pads) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pads[2 * i], pads[2 * i + 1]
    value = b.const(node.attrs["value"], in_dtype(node))
    return [b.op1("Pad", [x[0], b.dims(begins + ends), value], mode="constant")]


def flip(b: Builder, node: Node, x: list) -> list:
    dims = list(node.attrs["dims"])
    if not dims:
        return [b.op1("Identity", x)]
    n = len(dims)
    return [b.op1("Slice", [x[0], b.ints([-1] * n), b.ints([INT64_MIN] * n), b.ints(dims),
                            b.ints([-1] * n)])]


def triangle(b: Builder, node: Node, x: list) -> list:
    upper = int(node.op == "triu")
    k = b.const(int(node.attrs["diagonal"]), DType.i64)
    dtype = in_dtype(node)
    if dtype in TRILU_DTYPES:
        return [b.op1("Trilu", [x[0], k], upper=upper)]
    keep = b.op1("Trilu", [b.op1("ConstantOfShape", [b.op1("Shape", x)],
                                 value=fill_value(True, DType.bool)), k], upper=upper)
    return [b.op1("Where", [keep, x[0], b.const(0, dtype)])]


def repeat(b: Builder, node: Node, x: list) -> list:
    """torch's repeat prepends size-1 dims when given more repeats than the tensor has dims."""
    src = node.inputs[0].type
    reps = list(node.attrs["repeats"])
    v = x[0]
    if len(reps) > src.rank:
        v = b.op1("Reshape", [v, b.dims([1] * (len(reps) - src.rank) + list(src.shape))])
    return [b.op1("Tile", [v, b.dims(reps)])]


def _symbolic_scalar(b: Builder, value, dtype: DType) -> str:
    """A 0-d tensor of a size expression (a cache length, say), computed from the input shapes
    at run time and cast to `dtype`."""
    scalar = b.scalar_dim(value)
    return scalar if dtype == DType.i64 else b.op1("Cast", [scalar], to=ONNX_DTYPES[dtype])


def constant(b: Builder, node: Node, x: list) -> list:
    value, dtype = node.attrs["value"], node.attrs["dtype"]
    if getattr(value, "free_symbols", None):
        return [_symbolic_scalar(b, value, dtype)]
    return [b.const(value, dtype)]


def full(b: Builder, node: Node, x: list) -> list:
    value, dtype, shape = node.attrs["value"], node.attrs["dtype"], list(node.attrs["shape"])
    if getattr(value, "free_symbols", None):
        return [b.op1("Expand", [_symbolic_scalar(b, value, dtype), b.dims(shape)])]
    return [b.op1("ConstantOfShape", [b.dims(shape)], value=fill_value(value, dtype))]


def arange(b: Builder, node: Node, x: list) -> list:
    """Integers come from Range; floats as start + i * step over an int64 Range of the length.

    The float form computes each element independently, as torch does, instead of summing step
    repeatedly, so long ranges do not drift.
    """
    a, dtype = node.attrs, out_dtype(node)
    floats = any(isinstance(v, float) for v in (a["start"], a["end"], a["step"]))
    if not dtype.is_float and not floats:
        out = b.op1("Range", [b.scalar_dim(a["start"]), b.scalar_dim(a["end"]),
                              b.scalar_dim(a["step"])])
        return [out if dtype == DType.i64 else b.op1("Cast", [out], to=ONNX_DTYPES[dtype])]
    f64 = ONNX_DTYPES[DType.f64]
    length = node.outputs[0].type.shape[0]
    steps = b.op1("Range", [b.const(0, DType.i64), b.scalar_dim(length), b.const(1, DType.i64)])
    steps = b.op1("Cast", [steps], to=f64)
    start = a["start"]
    start = (b.const(float(start), DType.f64) if isinstance(start, (int, float))
             else b.op1("Cast", [b.scalar_dim(start)], to=f64))
    values = b.op1("Add", [b.op1("Mul", [steps, b.const(float(a["step"]), DType.f64)]), start])
    return [b.op1("Cast", [values], to=ONNX_DTYPES[dtype])]


def table() -> dict[str, Converter]:
    return {"reshape": reshape, "permute": permute, "expand": expand, "slice": slice_,
            "select": select, "concat": concat, "gather": gather, "index_select": index_select,
            "index": index, "pad": pad, "flip": flip, "tril": triangle, "triu": triangle,
            "repeat": repeat, "constant": constant, "full": full, "arange": arange}
