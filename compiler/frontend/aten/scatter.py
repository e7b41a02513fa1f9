"""Data-dependent writes with a static result shape: masked_scatter (the image-token merge of
LLaVA-style models) and torch's scatter family (scatter .src/.value/.reduce, scatter_add,
scatter_reduce).

The IR's `scatter` is ONNX's ScatterElements: src of the index's shape, and a reduction that
always includes the target's own value. torch's other forms are built from it here:
- a src larger than the index is cut to the index's shape (torch reads only that corner);
- `include_self=False` first writes the reduction's identity (0, 1, -inf, +inf) where any index
  points, then reduces into that;
- `mean` is a `sum` divided by how many values landed on each element (plus one for the target's
  own value when included); elements nothing lands on keep their value, as in torch.
"""

from __future__ import annotations

from compiler.ir import DType, Value

from ..emitter import AtenEmitter, Unsupported
from .table import converts


@converts("masked_scatter.default", ir="masked_scatter")
def _masked_scatter(em: AtenEmitter, a):
    mask = a["mask"]
    if mask.dtype != DType.bool:
        raise Unsupported(f"masked_scatter with a {mask.dtype} mask (torch requires bool)")
    dtype = em.out_dtype()
    return em.op("masked_scatter", em.cast(a["self"], dtype), mask, em.cast(a["source"], dtype))


# torch's reduce names (scatter's `add`/`multiply`, scatter_reduce's) -> the IR's
_REDUCE = {"add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod", "amax": "amax",
           "amin": "amin", "mean": "mean"}


def _identity(reduce: str, dtype: DType) -> float | int:
    """The value that leaves a reduction unchanged: what `include_self=False` seeds."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.is_float:
        return float("-inf") if reduce == "amax" else float("inf")
    import torch

    info = torch.iinfo(dtype.to_torch())
    return info.min if reduce == "amax" else info.max


def _src_like_index(em: AtenEmitter, src: Value, index: Value) -> Value:
    """`src` cut to the index's shape: torch reads src[i][j] only where index has an element."""
    for dim, (have, want) in enumerate(zip(src.shape, index.shape)):
        if have != want:
            src = em.op("slice", src, dim=dim, start=0, end=want, step=1)
    return src


def _filled(em: AtenEmitter, value, index: Value, dtype: DType) -> Value:
    return em.op("full", shape=list(index.shape), value=value, dtype=dtype)


def _scatter(em: AtenEmitter, x: Value, dim: int, index: Value, src, reduce: str,
             include_self: bool = True) -> Value:
    """torch's scatter/scatter_reduce of `src` (a Value or a Python scalar) into `x`."""
    dtype = em.out_dtype()
    if dtype == DType.bool and reduce != "none":
        raise Unsupported(f"scatter with reduce={reduce!r} on a bool tensor")
    x = em.cast(x, dtype)
    if index.type.rank != x.type.rank:
        raise Unsupported(f"scatter with an index of rank {index.type.rank} into a tensor of "
                          f"rank {x.type.rank} (torch requires equal ranks)")
    src = _filled(em, src, index, dtype) if not isinstance(src, Value) else \
        _src_like_index(em, em.cast(src, dtype), index)
    if reduce == "none":
        return em.op("scatter", x, index, src, dim=dim, reduce="none")
    if not include_self:  # seed the identity wherever an index points
        seed = _identity(reduce, dtype)
        x = em.op("scatter", x, index, _filled(em, seed, index, dtype), dim=dim, reduce="none")
    if reduce != "mean":
        return em.op("scatter", x, index, src, dim=dim, reduce=reduce)
    total = em.op("scatter", x, index, src, dim=dim, reduce="sum")
    start = em.op("full", shape=list(x.shape), value=1 if include_self else 0, dtype=dtype)
    count = em.op("scatter", start, index, _filled(em, 1, index, dtype), dim=dim, reduce="sum")
    count = em.op("maximum", count, em.const(1, dtype))  # nothing landed: x / 1 = x
    rounding = None if dtype.is_float else "floor"
    return em.op("div", total, count, rounding_mode=rounding)


@converts("scatter.src", "scatter.value", ir="scatter")
def _scatter_plain(em: AtenEmitter, a):
    src = a["src"] if "src" in a else a["value"]
    return _scatter(em, a["self"], a["dim"], a["index"], src, "none")


@converts("scatter.reduce", "scatter.value_reduce", ir="scatter")
def _scatter_with_reduce(em: AtenEmitter, a):
    src = a["src"] if "src" in a else a["value"]
    if a["reduce"] not in ("add", "multiply"):
        raise Unsupported(f"scatter with reduce={a['reduce']!r} (torch takes add, multiply)")
    return _scatter(em, a["self"], a["dim"], a["index"], src, _REDUCE[a["reduce"]])


@converts("scatter_add.default", ir="scatter")
def _scatter_add(em: AtenEmitter, a):
    return _scatter(em, a["self"], a["dim"], a["index"], a["src"], "sum")


@converts("scatter_reduce.two", ir="scatter, full, maximum, div")
def _scatter_reduce(em: AtenEmitter, a):
    reduce = _REDUCE.get(a["reduce"])
    if reduce is None:
        raise Unsupported(f"scatter_reduce with reduce={a['reduce']!r}")
    return _scatter(em, a["self"], a["dim"], a["index"], a["src"], reduce,
                    bool(a["include_self"]))
