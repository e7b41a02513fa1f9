"""Sorting and routed (grouped) matrix products: what a mixture-of-experts layer is made of.

transformers' default expert path sorts the token-expert pairs by expert (`sort`), counts them
per expert (histc, decomposed by the frontend), multiplies each contiguous group of rows by its
expert's weight (`grouped_matmul`), and puts the rows back in token order with the inverse
permutation (`index_put`). Every result shape here is static: which rows go to which expert is
data, but the number of rows is not.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..symbolic import equal
from ..types import TensorType
from . import shape_rules as rules
from .fused import Emitter, decomposes
from .registry import REQUIRED, ShapeError, define


def _torch():
    import torch

    return torch


def _sort_rule(types, attrs):
    x = types[0]
    rules.norm_axis(attrs["dim"], max(x.rank, 1))
    return [x, TensorType(DType.i64, x.shape)]


def _sort(x, dim, descending):
    # stable: equal elements keep their order (what the backends' TopK-based sorts give too)
    return tuple(_torch().sort(x, dim=dim, descending=descending, stable=True))


define("sort", "x", _sort_rule, _sort, "reduction",
       "(values, indices) of x sorted along dim, stably (equal elements keep their order)",
       dim=-1, descending=False)


def _grouped_matmul_rule(types, attrs):
    x, w, offsets = types
    if x.rank != 2 or w.rank != 3 or offsets.rank != 1:
        raise ShapeError(f"grouped_matmul takes x [rows, k], weight [groups, k, n] and offsets "
                         f"[groups]; got {x}, {w}, {offsets}")
    if not equal(x.shape[1], w.shape[1]) or not equal(w.shape[0], offsets.shape[0]):
        raise ShapeError(f"grouped_matmul: x {x}, weight {w} and offsets {offsets} do not fit")
    if x.dtype != w.dtype or offsets.dtype.is_float:
        raise ShapeError(f"grouped_matmul: x and weight must share a dtype and offsets be "
                         f"integers; got {x.dtype}, {w.dtype}, {offsets.dtype}")
    return [TensorType(x.dtype, (x.shape[0], w.shape[2]))]


def _grouped_matmul(x, w, offsets):
    """Rows offsets[g-1]:offsets[g] times weight[g]; rows at or past offsets[-1] are zero
    (transformers' grouped_mm_fallback, the contract of torch's grouped_mm)."""
    torch = _torch()
    out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype)
    start = 0
    for g, end in enumerate(offsets.tolist()):
        end = min(max(end, start), x.shape[0])
        if end > start:
            out[start:end] = x[start:end] @ w[g]
        start = end
    return out


define("grouped_matmul", "x weight offsets", _grouped_matmul_rule, _grouped_matmul, "matmul",
       "row block g (offsets[g-1] <= row < offsets[g]) of x times weight[g]; rows from "
       "offsets[-1] on are zero")


def _index_put_rule(types, attrs):
    x, values, *indices = types
    present = [t for t in indices if t is not None]
    if not present or len(indices) > x.rank:
        raise ShapeError(f"index_put needs 1 to {x.rank} index tensors, got {len(present)}")
    if any(t.dtype.is_float or t.dtype == DType.bool for t in present):
        raise ShapeError("index_put indices must be integers")
    if values.dtype != x.dtype:
        raise ShapeError(f"index_put values are {values.dtype}, the target is {x.dtype}")
    return [x]


def _index_put(x, values, *indices, accumulate):
    return x.index_put(tuple(indices), values, accumulate=accumulate)


define("index_put", "x values indices*", _index_put_rule, _index_put, "indexing",
       "x with x[indices] replaced by (accumulate: increased by) values, broadcast to the "
       "indexed shape", accumulate=False)


def _histc_rule(types, attrs):
    x = types[0]
    if not x.dtype.is_float:
        raise ShapeError(f"histc counts floats, got {x.dtype}")
    if attrs["bins"] <= 0 or not attrs["min"] < attrs["max"]:
        raise ShapeError(f"histc needs bins > 0 and min < max, got bins={attrs['bins']}, "
                         f"min={attrs['min']}, max={attrs['max']}")
    return [TensorType(x.dtype, (attrs["bins"],))]


define("histc", "x", _histc_rule,
       lambda x, bins, min, max: _torch().histc(x, bins=bins, min=min, max=max), "reduction",
       "counts of x's elements in `bins` equal-width bins over [min, max] (torch.histc)",
       bins=REQUIRED, min=REQUIRED, max=REQUIRED)


@decomposes("histc")
def _histc_decomposition(e: Emitter, inputs, attrs):
    """torch's CPU kernel: an element's bin is trunc((x - min) * bins / (max - min)) in x's
    dtype, the element equal to max goes to the last bin, elements outside the range and NaN are
    not counted; the same arithmetic in the same order gives the same integers."""
    x = inputs[0]
    bins, dtype = attrs["bins"], x.dtype
    scalar = np.dtype(dtype.to_numpy()).type
    low, high = scalar(attrs["min"]), scalar(attrs["max"])
    flat = e.op("reshape", x, shape=[-1])
    inside = e.op("logical_and", e.op("ge", flat, e.const(float(low), dtype)),
                  e.op("le", flat, e.const(float(high), dtype)))
    scaled = e.op("mul", e.op("sub", flat, e.const(float(low), dtype)), e.const(float(bins), dtype))
    width = float(np.subtract(high, low, dtype=low.dtype))
    position = e.op("cast", e.op("div", scaled, e.const(width, dtype)), dtype=DType.i64)
    # NaN and out-of-range elements may cast to anything: the mask drops them
    position = e.op("minimum", e.op("maximum", position, e.const(0, DType.i64)),
                    e.const(bins - 1, DType.i64))
    hits = e.op("eq", e.op("reshape", position, shape=[-1, 1]),
                e.op("arange", start=0, end=bins, step=1, dtype=DType.i64))
    hits = e.op("logical_and", hits, e.op("reshape", inside, shape=[-1, 1]))
    return [e.op("sum", e.op("cast", hits, dtype=dtype), dims=[0], keepdim=False)]
