"""Sorting and counting: `sort`/`argsort` become the IR's stable `sort`, `histc` its exact
decomposition into compares and a sum.

`histc` is torch's histogram with equal-width bins over [min, max]: an element's bin is
trunc((x - min) * bins / (max - min)) in x's dtype, the element equal to max goes to the last
bin, elements outside the range (and NaN) are not counted. Those are the arithmetic and the order
of torch's CPU kernel, so the counts are the same integers. min == max == 0 (take the range from
the data) is refused: the bins would depend on the values.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import DType

from ..emitter import AtenEmitter, Unsupported
from .table import converts


@converts("sort.default", "sort.stable", ir="sort")
def _sort(em: AtenEmitter, a):
    """torch.sort without stable=True may order equal elements either way; the IR sorts stably,
    which is one of the orders torch allows (and the one its CPU kernel gives)."""
    if a["self"].dtype == DType.bool:
        raise Unsupported("sorting a bool tensor")
    values, indices = em.ops("sort", a["self"], dim=a["dim"], descending=bool(a["descending"]))
    return values, indices


@converts("argsort.default", "argsort.stable", ir="sort")
def _argsort(em: AtenEmitter, a):
    if a["self"].dtype == DType.bool:
        raise Unsupported("sorting a bool tensor")
    return em.ops("sort", a["self"], dim=a["dim"], descending=bool(a["descending"]))[1]


@converts("histc.default", ir="sub, mul, div, cast, eq, sum")
def _histc(em: AtenEmitter, a):
    x = a["self"]
    if not x.dtype.is_float:
        raise Unsupported(f"histc of {x.dtype} (torch's CPU kernel takes floats only)")
    bins, low, high = int(a["bins"]), float(a["min"]), float(a["max"])
    if bins <= 0:
        raise Unsupported(f"histc with bins={bins}")
    if low == high == 0.0:
        raise Unsupported("histc with min == max == 0 (a range taken from the data)")
    if low > high:
        raise Unsupported(f"histc with min {low} > max {high}")
    if low == high:  # torch widens an empty range by one on each side
        low, high = low - 1.0, high + 1.0
    dtype = x.dtype
    np_dtype = np.dtype(dtype.to_numpy()).type
    low_c, high_c = np_dtype(low), np_dtype(high)
    flat = em.op("reshape", x, shape=[-1])
    inside = em.op("logical_and", em.op("ge", flat, em.const(float(low_c), dtype)),
                   em.op("le", flat, em.const(float(high_c), dtype)))
    scaled = em.op("mul", em.op("sub", flat, em.const(float(low_c), dtype)),
                   em.const(float(bins), dtype))
    width = float(np.subtract(high_c, low_c, dtype=np_dtype))
    position = em.op("cast", em.op("div", scaled, em.const(width, dtype)), dtype=DType.i64)
    # NaN and out-of-range elements may cast to anything: the mask drops them
    position = em.op("minimum", em.op("maximum", position, em.const(0, DType.i64)),
                     em.const(bins - 1, DType.i64))
    hits = em.op("eq", em.op("reshape", position, shape=[-1, 1]),
                 em.op("arange", start=0, end=bins, step=1, dtype=DType.i64))
    hits = em.op("logical_and", hits, em.op("reshape", inside, shape=[-1, 1]))
    return em.op("sum", em.op("cast", hits, dtype=dtype), dims=[0], keepdim=False)
