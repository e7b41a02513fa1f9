"""Sorting and counting: `sort`/`argsort` become the IR's stable `sort`, `histc` the IR's
`histc` (defined by an exact decomposition into compares and a sum, compiler/ir/ops/sorting.py).

min == max == 0 (take the range from the data) is refused: the bins would depend on the values;
min == max otherwise widens the range by one on each side, as torch does. Integer input (torch's
CUDA kernel takes it; transformers' expert path uses it on every device but CPU and MPS, the meta
device of a streamed checkpoint included) is counted as f64, exact for every i32 and for i64 up to
2**53, and the counts come back in the input's dtype, as torch returns them.
"""

from __future__ import annotations

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


@converts("histc.default", ir="histc")
def _histc(em: AtenEmitter, a):
    x = a["self"]
    if x.dtype == DType.bool:
        raise Unsupported("histc of a bool tensor")
    bins, low, high = int(a["bins"]), float(a["min"]), float(a["max"])
    if bins <= 0:
        raise Unsupported(f"histc with bins={bins}")
    if low == high == 0.0:
        raise Unsupported("histc with min == max == 0 (a range taken from the data)")
    if low > high:
        raise Unsupported(f"histc with min {low} > max {high}")
    if low == high:  # torch widens an empty range by one on each side
        low, high = low - 1.0, high + 1.0
    if x.dtype.is_float:
        return em.op("histc", x, bins=bins, min=low, max=high)
    counts = em.op("histc", em.cast(x, DType.f64), bins=bins, min=low, max=high)
    return em.cast(counts, x.dtype)
