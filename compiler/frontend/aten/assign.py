"""In-place assignments as torch.export functionalizes them: `x[:, a:b] = y` and `x[mask] = v`.

`slice_scatter` (step 1) is the untouched parts and the new slice, concatenated; `index_put` with
one boolean mask and a single value is a `where`, the form attention-mask code takes
(`scores[mask] = -inf`). Other index_put forms scatter to data-dependent places: unsupported.
"""

from __future__ import annotations

from compiler.ir import DType
from compiler.ir.symbolic import normalize

from ..emitter import AtenEmitter, Unsupported
from .table import converts

_HUGE = 2**62  # ATen writes "to the end" as INT64_MAX


def _bound(i, size, default):
    """A start/end as a dim in [0, size]: None -> default, negatives from the end, clamped."""
    if i is None:
        return default
    if isinstance(i, int) and i >= _HUGE:
        return size
    if isinstance(i, int) and i < 0:
        i = size + i
        return max(i, 0) if isinstance(i, int) else normalize(i)
    if isinstance(i, int) and isinstance(size, int):
        return min(i, size)
    return i


@converts("slice_scatter.default", ir="slice, concat")
def _slice_scatter(em: AtenEmitter, a):
    x, src = a["self"], em.cast(a["src"], em.out_dtype())
    if a["step"] != 1:
        raise Unsupported("slice assignment with a step other than 1")
    dim = a["dim"] % max(x.type.rank, 1)
    size = x.shape[dim]
    start, end = _bound(a["start"], size, 0), _bound(a["end"], size, size)
    parts = []
    if start != 0:
        parts.append(em.op("slice", x, dim=dim, start=0, end=start, step=1))
    parts.append(src)
    if end != size:
        parts.append(em.op("slice", x, dim=dim, start=end, end=size, step=1))
    return parts[0] if len(parts) == 1 else em.op("concat", *parts, dim=dim)


@converts("index_put.default", ir="where")
def _index_put(em: AtenEmitter, a):
    x, indices, values = a["self"], list(a["indices"]), a["values"]
    mask = indices[0] if len(indices) == 1 else None
    if mask is None or mask.dtype != DType.bool or mask.type.rank > x.type.rank:
        raise Unsupported("index assignment other than x[bool_mask] = value (a scatter)")
    if any(not isinstance(d, int) or d != 1 for d in values.shape):
        raise Unsupported("x[bool_mask] = tensor with more than one element (data-dependent)")
    dtype = em.out_dtype()
    value = em.op("reshape", em.cast(values, dtype), shape=[])
    if a["accumulate"]:
        value = em.op("add", x, value)
    trailing = [1] * (x.type.rank - mask.type.rank)
    if trailing:
        mask = em.op("reshape", mask, shape=[*mask.shape, *trailing])
    return em.op("where", mask, value, x)
