"""View and data-movement ops, indexing, and tensor creation.

Shapes in attributes may be symbolic (`shape=[s0, 8, 64]`): the runtime binds size symbols from
the inputs and resolves attributes before running an op, so one graph serves every size in range.
"""

from __future__ import annotations

import sympy

from ..dtypes import DType
from ..symbolic import Dim, equal, normalize, product
from ..types import TensorType
from . import shape_rules as rules
from .registry import REQUIRED, ShapeError, define


def _torch():
    import torch

    return torch


def _aten():
    return _torch().ops.aten


def _reshape_rule(types, attrs):
    x = types[0]
    shape = list(attrs["shape"])
    if -1 in shape:
        known = product(d for d in shape if d != -1)
        shape[shape.index(-1)] = normalize(sympy.sympify(product(x.shape)) / known)
    if not equal(product(shape), product(x.shape)):
        raise ShapeError(f"reshape of {x} to {shape} changes the element count")
    return [x.with_shape(shape)]


define("reshape", "x", _reshape_rule, lambda x, shape: x.reshape(list(shape)), "view",
       "same elements in a new shape (row-major)", shape=REQUIRED)


def _permute_rule(types, attrs):
    x = types[0]
    dims = [rules.norm_axis(d, x.rank) for d in attrs["dims"]]
    if sorted(dims) != list(range(x.rank)):
        raise ShapeError(f"permute dims {attrs['dims']} are not a permutation of rank {x.rank}")
    return [x.with_shape(x.shape[d] for d in dims)]


define("permute", "x", _permute_rule, lambda x, dims: x.permute(list(dims)), "view",
       "reorder axes", dims=REQUIRED)


def _expand_rule(types, attrs):
    x = types[0]
    shape = list(attrs["shape"])
    if len(shape) < x.rank:
        raise ShapeError(f"expand of {x} to fewer dims {shape}")
    lead = len(shape) - x.rank
    out = []
    for i, d in enumerate(shape):
        src = x.shape[i - lead] if i >= lead else 1
        if d == -1:
            d = src
        if src != 1 and not equal(src, d):
            raise ShapeError(f"expand of {x} to {shape}: dim {i} is {src}, not 1")
        out.append(d)
    return [x.with_shape(out)]


define("expand", "x", _expand_rule, lambda x, shape: x.expand(list(shape)), "view",
       "broadcast to a larger shape without copying", shape=REQUIRED)


_OPEN_END = 2**62  # torch.export writes sys.maxsize for an open end (`x[1:]`)


def _slice_bound(index: Dim, size: Dim) -> Dim:
    """A bound on a symbolic dim the way torch (and so every backend) reads it: negative counts
    from the end, a symbolic one too when it is provably negative (`-s0`: sizes are positive),
    an open end is the size. Other bounds are taken as in range (torch.export guards them so).
    Typing `slice{start=-s0, end=0}` as s0 long once hid a lowering that returned it empty."""
    if isinstance(index, int) and index < 0:
        return size + index
    if isinstance(index, sympy.Basic) and index.is_negative:
        return size + index
    if isinstance(index, int) and index >= _OPEN_END:
        return size
    return index


def _slice_len(size: Dim, start: Dim, end: Dim, step: int) -> Dim:
    if all(isinstance(v, int) for v in (size, start, end)):
        return len(range(*slice(start, end, step).indices(size)))
    start, end = _slice_bound(start, size), _slice_bound(end, size)
    return normalize(sympy.ceiling((sympy.sympify(end) - start) / step))


def _slice_rule(types, attrs):
    x = types[0]
    dim = rules.norm_axis(attrs["dim"], x.rank)
    length = _slice_len(x.shape[dim], attrs["start"], attrs["end"], attrs["step"])
    return [x.with_shape(x.shape[:dim] + (length,) + x.shape[dim + 1:])]


define("slice", "x", _slice_rule,
       lambda x, dim, start, end, step: _aten().slice.Tensor(x, dim, start, end, step), "view",
       "elements start:end:step along dim", dim=REQUIRED, start=0, end=REQUIRED, step=1)


def _select_rule(types, attrs):
    x = types[0]
    dim = rules.norm_axis(attrs["dim"], x.rank)
    return [x.with_shape(x.shape[:dim] + x.shape[dim + 1:])]


define("select", "x", _select_rule, lambda x, dim, index: x.select(dim, index), "view",
       "one index along dim, removing it", dim=REQUIRED, index=REQUIRED)


def _concat_rule(types, attrs):
    dtype = rules.same_dtype(types, "concat")
    first = types[0]
    dim = rules.norm_axis(attrs["dim"], first.rank)
    total = normalize(sum((sympy.sympify(t.shape[dim]) for t in types), sympy.Integer(0)))
    return [TensorType(dtype, first.shape[:dim] + (total,) + first.shape[dim + 1:])]


define("concat", "xs*", _concat_rule, lambda *xs, dim: _torch().cat(xs, dim=dim), "data_movement",
       "join along dim", dim=0)


def _gather_rule(types, attrs):
    return [types[0].with_shape(types[1].shape)]


define("gather", "x index", _gather_rule, lambda x, i, dim: _torch().gather(x, dim, i), "indexing",
       "out[i][j] = x[index[i][j]][j] along dim", dim=REQUIRED)


def _index_select_rule(types, attrs):
    x, index = types
    dim = rules.norm_axis(attrs["dim"], x.rank)
    return [x.with_shape(x.shape[:dim] + index.shape + x.shape[dim + 1:])]


define("index_select", "x index", _index_select_rule,
       lambda x, i, dim: _torch().index_select(x, dim, i), "indexing",
       "slices of x at the indices along dim", dim=REQUIRED)


def _index_rule(types, attrs):
    x, indices = types[0], types[1:]
    present = [i for i, t in enumerate(indices) if t is not None]
    if not present:
        raise ShapeError("index needs at least one index tensor")
    bshape = rules.broadcast_shapes(*(indices[i].shape for i in present))
    adjacent = present == list(range(present[0], present[-1] + 1))
    rest_before = x.shape[: present[0]]
    rest_after = x.shape[len(indices):]
    if adjacent:
        middle = tuple(x.shape[i] for i in range(present[-1] + 1, len(indices)) if i not in present)
        shape = rest_before + bshape + middle + rest_after
    else:
        others = tuple(x.shape[i] for i in range(len(indices)) if i not in present)
        shape = bshape + others + rest_after
    return [x.with_shape(shape)]


define("index", "x indices*", _index_rule,
       lambda x, *indices: _aten().index.Tensor(x, list(indices)), "indexing",
       "numpy advanced indexing; `_` keeps an axis whole")


def _pad_rule(types, attrs):
    x = types[0]
    pads = attrs["pads"]  # torch order: last dim first, (before, after) pairs
    shape = list(x.shape)
    for i in range(len(pads) // 2):
        axis = x.rank - 1 - i
        shape[axis] = normalize(shape[axis] + pads[2 * i] + pads[2 * i + 1])
    return [x.with_shape(shape)]


define("pad", "x", _pad_rule,
       lambda x, pads, value: _aten().constant_pad_nd(x, list(pads), value), "data_movement",
       "constant padding; pads as torch orders them (last dim first)", pads=REQUIRED, value=0.0)
define("flip", "x", rules.unary, lambda x, dims: _torch().flip(x, list(dims)), "data_movement",
       "reverse along dims", dims=REQUIRED)
define("tril", "x", rules.unary, lambda x, diagonal: _torch().tril(x, diagonal), "data_movement",
       "lower triangle, rest zero", diagonal=0)
define("triu", "x", rules.unary, lambda x, diagonal: _torch().triu(x, diagonal), "data_movement",
       "upper triangle, rest zero", diagonal=0)


def _repeat_rule(types, attrs):
    x = types[0]
    reps = list(attrs["repeats"])
    shape = (1,) * (len(reps) - x.rank) + tuple(x.shape)
    return [x.with_shape(normalize(d * r) for d, r in zip(shape, reps))]


define("repeat", "x", _repeat_rule, lambda x, repeats: x.repeat(list(repeats)), "data_movement",
       "tile x repeats times along each dim", repeats=REQUIRED)


def _topk_rule(types, attrs):
    x = types[0]
    dim = rules.norm_axis(attrs["dim"], x.rank)
    shape = x.shape[:dim] + (attrs["k"],) + x.shape[dim + 1:]
    return [x.with_shape(shape), TensorType(DType.i64, shape)]


define("topk", "x", _topk_rule,
       lambda x, k, dim, largest, sorted: tuple(_torch().topk(x, k, dim, largest, sorted)),
       "reduction", "k largest (or smallest) values and their indices", k=REQUIRED, dim=-1,
       largest=True, sorted=True)


# -- creation -----------------------------------------------------------------------------------
def _constant_rule(types, attrs):
    return [TensorType(attrs["dtype"], ())]


define("constant", "", _constant_rule,
       lambda value, dtype: _torch().tensor(value, dtype=dtype.to_torch()), "creation",
       "a scalar (0-d tensor)", value=REQUIRED, dtype=REQUIRED)


def _full_rule(types, attrs):
    return [TensorType(attrs["dtype"], tuple(attrs["shape"]))]


define("full", "", _full_rule,
       lambda shape, value, dtype: _torch().full(list(shape), value, dtype=dtype.to_torch()),
       "creation", "a tensor filled with one value", shape=REQUIRED, value=REQUIRED,
       dtype=REQUIRED)


def _arange_rule(types, attrs):
    start, end, step = attrs["start"], attrs["end"], attrs["step"]
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        import math

        length = max(0, math.ceil((end - start) / step))
    else:
        length = normalize(sympy.ceiling((sympy.sympify(end) - start) / step))
    return [TensorType(attrs["dtype"], (length,))]


define("arange", "", _arange_rule,
       lambda start, end, step, dtype: _torch().arange(start, end, step, dtype=dtype.to_torch()),
       "creation", "start, start+step, ... below end", start=0, end=REQUIRED, step=1,
       dtype=DType.i64)
