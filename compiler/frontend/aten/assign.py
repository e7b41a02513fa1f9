"""In-place assignments as torch.export functionalizes them: `x[:, a:b] = y` and `x[mask] = v`.

`slice_scatter` (step 1) is the untouched parts and the new slice, concatenated; with a step
(interleaved M-RoPE's `freqs[..., offset:length:3] = ...`, Qwen3.5) it is a `scatter` to the
positions start + step * i along a static dim; `index_put` with
one boolean mask and a single value is a `where`, the form attention-mask code takes
(`scores[mask] = -inf`); with integer index tensors it is the IR's `index_put` (a scatter to
places the data picks, into a result of x's static shape: MoE layers invert their sort
permutation with `inv[perm] = arange(n)`). Other boolean-mask forms are data-dependent in size:
unsupported.
"""

from __future__ import annotations

import sympy

from compiler.ir import DType
from compiler.ir.symbolic import equal, normalize

from ..emitter import AtenEmitter, Unsupported
from .shape import slice_start
from .table import converts


@converts("slice_scatter.default", ir="slice, concat, scatter")
def _slice_scatter(em: AtenEmitter, a):
    """The start as a slice takes it (negatives from the end of the dim, symbolic ones too, then
    clamped: `buf[:, -x.shape[1]:] = x`), the end as start + the length of `src`, which torch
    computed: an end counted from the end or past it needs no rule of its own."""
    x, src = a["self"], em.cast(a["src"], em.out_dtype())
    dim = a["dim"] % max(x.type.rank, 1)
    size = x.shape[dim]
    start = slice_start(em, 0 if a["start"] is None else a["start"], size)
    if a["step"] != 1:
        return _strided_slice_scatter(em, x, src, dim, start, a["step"])
    end = start + src.shape[dim]
    end = normalize(sympy.simplify(end)) if isinstance(end, sympy.Basic) else end
    parts = []
    if not equal(start, 0):
        parts.append(em.op("slice", x, dim=dim, start=0, end=start, step=1))
    parts.append(src)
    if not equal(end, size):
        parts.append(em.op("slice", x, dim=dim, start=end, end=size, step=1))
    return parts[0] if len(parts) == 1 else em.op("concat", *parts, dim=dim)


def _strided_slice_scatter(em: AtenEmitter, x, src, dim: int, start, step: int):
    """`x[start::step] = src` along `dim`: the positions are constants, so the dim, the start
    and src's length along it must be static (M-RoPE's sections are)."""
    count = src.shape[dim]
    if not all(isinstance(v, int) for v in (x.shape[dim], start, count, step)) or step < 1:
        raise Unsupported("slice assignment with a step other than 1 along a dynamic dim")
    where = [1] * x.type.rank
    where[dim] = count
    index = em.op("reshape", em.op("arange", start=start, end=start + step * count, step=step),
                  shape=where)
    index = em.op("expand", index, shape=list(src.shape))
    return em.op("scatter", x, index, src, dim=dim, reduce="none")


@converts("index_put.default", ir="where, index_put")
def _index_put(em: AtenEmitter, a):
    x, indices, values = a["self"], list(a["indices"]), a["values"]
    present = [i for i in indices if i is not None]
    if present and all(not i.dtype.is_float and i.dtype not in (DType.bool, DType.u8)
                       for i in present):
        return em.op("index_put", x, em.cast(values, x.dtype), *indices,
                     accumulate=bool(a["accumulate"]))
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
