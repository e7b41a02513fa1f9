"""Views, data movement and indexing; identities and dropped runtime checks.

Every view-like overload (view, _unsafe_view, reshape, unsqueeze, squeeze, ...) becomes one
`reshape` to the result shape torch computed, with symbolic dims (`shape=[1, s0, 4, 16]`), so -1
and squeezed axes are already resolved. Copies and aliases (clone, contiguous, alias, detach,
lift_fresh_copy, eval-mode dropout) are identities; a later pass removes no-op reshapes and casts.
"""

from __future__ import annotations

import sympy

from compiler.ir import DType
from compiler.ir.symbolic import normalize

from ..emitter import AtenEmitter, Unsupported
from ..size_bounds import bounds, decide_extrema
from .table import converts

# -- identities and dropped nodes ---------------------------------------------------------------


@converts("alias.default", "clone.default", "contiguous.default", "detach.default",
          "lift_fresh_copy.default", "lift_fresh.default", ir="(identity)")
def _identity(em: AtenEmitter, a):
    return a["self"]


@converts("dropout.default", "feature_dropout.default", "alpha_dropout.default", ir="(identity)")
def _dropout(em: AtenEmitter, a):
    if a["train"] and a["p"] != 0:
        raise Unsupported("dropout in training mode")
    return a["input"]


@converts("_assert_scalar.default", "sym_constrain_range.default",
          "sym_constrain_range_for_size.default", "_assert_tensor_metadata.default",
          "_assert_async.default", "_assert_async.msg", ir="(dropped)")
def _dropped(em: AtenEmitter, a):
    return None


# -- views ----------------------------------------------------------------------------------------
@converts("view.default", "_unsafe_view.default", "reshape.default", "unsqueeze.default",
          "squeeze.default", "squeeze.dim", "squeeze.dims", "view_copy.default",
          "unsqueeze_copy.default", "squeeze_copy.dims", "flatten.using_ints", ir="reshape")
def _reshape(em: AtenEmitter, a):
    return em.op("reshape", a["self"], shape=em.out_shape())


@converts("permute.default", "permute_copy.default", ir="permute")
def _permute(em: AtenEmitter, a):
    return em.op("permute", a["self"], dims=list(a["dims"]))


@converts("t.default", ir="permute")
def _t(em: AtenEmitter, a):
    x = a["self"]
    return em.op("permute", x, dims=[1, 0]) if x.type.rank == 2 else x


@converts("transpose.int", ir="permute")
def _transpose(em: AtenEmitter, a):
    x = a["self"]
    rank = max(x.type.rank, 1)
    dims = list(range(x.type.rank))
    if not dims:
        return x
    i, j = a["dim0"] % rank, a["dim1"] % rank
    dims[i], dims[j] = dims[j], dims[i]
    return em.op("permute", x, dims=dims)


@converts("expand.default", "expand_copy.default", ir="expand")
def _expand(em: AtenEmitter, a):
    return em.op("expand", a["self"], shape=em.out_shape())


# -- slicing ------------------------------------------------------------------------------------
def _sign(i, ranges) -> int | None:
    """-1, 0 or 1 for every size the symbols' ranges allow; None when it depends on the sizes."""
    lo, hi = bounds(i, ranges)
    if lo == hi == 0:
        return 0
    if hi < 0:
        return -1
    return 1 if lo >= 0 else None


def _from_end(i, size, ranges, what: str):
    """`i` with a negative value counted from the end of a dim of `size` (int or symbolic)."""
    sign = _sign(i, ranges)
    if sign is None:
        raise Unsupported(f"{what} {i}: whether it counts from the end depends on the sizes; "
                          "export with a range that makes it provably negative or non-negative")
    if sign >= 0:
        return i
    if isinstance(i, int) and isinstance(size, int):
        return i % size
    return normalize(sympy.simplify(size + i))


def _index(em: AtenEmitter, i, size):
    """An index into a dim (select): negatives count from the end; torch checked the range."""
    return _from_end(i, size, em.graph.symbols, "index")


def slice_start(em: AtenEmitter, start, size):
    """A slice start as torch takes it: negatives count from the end, then clamped to [0, size]
    (x[-7:] of 5 elements starts at 0, not at -7 mod 5). A start whose clamp depends on the
    sizes is refused rather than guessed."""
    ranges = em.graph.symbols
    if isinstance(start, int) and isinstance(size, int):
        return min(max(start + size if start < 0 else start, 0), size)
    start = decide_extrema(start, ranges)
    if isinstance(start, sympy.Integer):
        start = int(start)
        if isinstance(size, int):
            return min(max(start + size if start < 0 else start, 0), size)
    lo, hi = bounds(start, ranges)
    if hi < 0:  # counts from the end everywhere
        start = normalize(sympy.simplify(size + start))
        lo, hi = bounds(start, ranges)
    if lo < 0:
        raise Unsupported(f"slice start {start} may lie before the start of the dim; export "
                          "with a range that decides it")
    past_lo, past_hi = bounds(normalize(sympy.simplify(start - size)), ranges)
    if past_hi <= 0:  # never past the end (or exactly at it)
        return start
    if past_lo >= 0:  # always at or past the end: an empty slice at the end
        return size
    raise Unsupported(f"slice start {start} may lie past the end of the dim ({size}); "
                      "export with a range that decides it")


def _slice(em: AtenEmitter, x, dim: int, start, length, step: int, index: int = 0):
    """`x[start : start + length*step : step]` along dim, with the length torch computed."""
    size = x.shape[dim]
    start = slice_start(em, 0 if start is None else start, size)
    end = start if length == 0 else start + (length - 1) * step + 1
    start, end = (normalize(sympy.simplify(v)) if isinstance(v, sympy.Basic) else v
                  for v in (start, end))
    return em.op("slice", x, dim=dim, start=start, end=end, step=step)


@converts("slice.Tensor", "slice_copy.Tensor", ir="slice")
def _slice_tensor(em: AtenEmitter, a):
    x = a["self"]
    dim = a["dim"] % max(x.type.rank, 1)
    return _slice(em, x, dim, a["start"], em.out_shape()[dim], a["step"])


@converts("diff.default", ir="sub")
def _diff(em: AtenEmitter, a):
    """torch.diff: `n` rounds of x[1:] - x[:-1] along dim (`!=` for bool), after prepend/append."""
    dtype = em.out_dtype()
    x = a["self"]
    dim = a["dim"] % max(x.type.rank, 1)
    parts = [em.cast(p, x.dtype) for p in (a["prepend"], x, a["append"]) if p is not None]
    if len(parts) > 1:
        x = em.op("concat", *parts, dim=dim)
    op = "ne" if dtype == DType.bool else "sub"
    for _ in range(a["n"]):
        length = x.shape[dim] - 1
        x = em.op(op, _slice(em, x, dim, 1, length, 1), _slice(em, x, dim, 0, length, 1))
    return x


@converts("select.int", "select_copy.int", ir="select")
def _select(em: AtenEmitter, a):
    x = a["self"]
    dim = a["dim"] % max(x.type.rank, 1)
    return em.op("select", x, dim=dim, index=_index(em, a["index"], x.shape[dim]))


@converts("split.Tensor", "split_with_sizes.default", "split_with_sizes_copy.default",
          "split_copy.Tensor", ir="slice")
def _split(em: AtenEmitter, a):
    x = a["self"]
    dim = a["dim"] % max(x.type.rank, 1)
    outputs, start = [], 0
    for i in range(len(em.val)):
        length = em.out_shape(i)[dim]
        outputs.append(_slice(em, x, dim, start, length, 1))
        start = start + length
    return tuple(outputs)


@converts("unbind.int", "unbind_copy.int", ir="select")
def _unbind(em: AtenEmitter, a):
    x = a["self"]
    dim = a["dim"] % max(x.type.rank, 1)
    return tuple(em.op("select", x, dim=dim, index=i) for i in range(len(em.val)))


@converts("cat.default", ir="concat")
def _cat(em: AtenEmitter, a):
    dtype = em.out_dtype()
    tensors = [t for t in a["tensors"] if not _legacy_empty(t)] or list(a["tensors"][:1])
    dim = a["dim"] % max(tensors[0].type.rank, 1)
    return em.op("concat", *(em.cast(t, dtype) for t in tensors), dim=dim)


def _legacy_empty(t) -> bool:
    """torch.cat skips 1-d tensors of size 0 whatever the other operands' ranks."""
    return t.type.rank == 1 and t.shape[0] == 0


# -- indexing -------------------------------------------------------------------------------------
@converts("gather.default", ir="gather")
def _gather(em: AtenEmitter, a):
    return em.op("gather", a["self"], a["index"], dim=a["dim"])


@converts("index_select.default", ir="index_select")
def _index_select(em: AtenEmitter, a):
    if a["self"].type.rank == 0:  # only index 0 is valid: the scalar itself
        return a["self"]
    return em.op("index_select", a["self"], a["index"], dim=a["dim"])


@converts("index.Tensor", ir="index")
def _index_tensor(em: AtenEmitter, a):
    indices = list(a["indices"])
    if any(i is not None and i.dtype in (DType.bool, DType.u8) for i in indices):
        raise Unsupported("boolean-mask indexing (data-dependent result shape)")
    return em.op("index", a["self"], *indices)


# -- data movement ------------------------------------------------------------------------------
@converts("constant_pad_nd.default", ir="pad")
def _pad(em: AtenEmitter, a):
    x = a["self"]
    value = float(a["value"]) if x.dtype.is_float else int(a["value"])
    return em.op("pad", x, pads=list(a["pad"]), value=value)


@converts("flip.default", ir="flip")
def _flip(em: AtenEmitter, a):
    return em.op("flip", a["self"], dims=list(a["dims"]))


@converts("tril.default", ir="tril")
def _tril(em: AtenEmitter, a):
    return em.op("tril", a["self"], diagonal=a["diagonal"])


@converts("triu.default", ir="triu")
def _triu(em: AtenEmitter, a):
    return em.op("triu", a["self"], diagonal=a["diagonal"])


@converts("repeat.default", ir="repeat")
def _repeat(em: AtenEmitter, a):
    return em.op("repeat", a["self"], repeats=list(a["repeats"]))


@converts("copy.default", ir="cast, expand")
def _copy(em: AtenEmitter, a):
    src = em.cast(a["src"], em.out_dtype())
    return em.op("expand", src, shape=em.out_shape())


@converts("unfold.default", ir="arange, add, reshape, index_select, permute")
def _unfold(em: AtenEmitter, a):
    """Tensor.unfold(dim, size, step): windows of `size` elements every `step` along dim, as a
    new last dim. Row w of the windows is elements w*step .. w*step + size - 1: one
    `index_select` of those positions (the window count as torch computed it, symbolic along a
    dynamic dim), reshaped to [..., windows, size, ...] and the size axis moved last."""
    x, size, step = a["self"], a["size"], a["step"]
    if x.type.rank == 0:  # a 0-d tensor is one window of one element
        if list(em.out_shape()) != [1]:
            raise Unsupported("unfold of a 0-d tensor into an empty window")
        return em.op("reshape", x, shape=[1])
    dim = a["dimension"] % x.type.rank
    count = em.out_shape()[dim]
    starts = em.op("reshape", em.op("arange", start=0, end=count * step, step=step),
                   shape=[count, 1])
    offsets = em.op("reshape", em.op("arange", start=0, end=size, step=1), shape=[1, size])
    index = em.op("reshape", em.op("add", starts, offsets), shape=[count * size])
    picked = em.op("index_select", x, index, dim=dim)
    shape = list(x.shape)
    windows = em.op("reshape", picked, shape=[*shape[:dim], count, size, *shape[dim + 1:]])
    rank = x.type.rank + 1
    order = [*range(dim + 1), *range(dim + 2, rank), dim + 1]
    return em.op("permute", windows, dims=order)
