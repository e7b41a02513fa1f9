"""Data-dependent merges whose result shape is still static: masked_scatter, scatter.

Vision-language models (LLaVA and its descendants) splice image features into the token sequence
where the prompt holds image placeholder tokens: `embeds.masked_scatter(mask, features)`. Which
positions receive features depends on the data, but the result has the shape of `embeds`, so the
op fits a static-shape IR and every backend can lower it (a cumulative sum of the mask gives each
masked position its index into the flattened source).

`scatter` is torch's scatter/scatter_add/scatter_reduce in the form ONNX's ScatterElements takes:
src already cut to the index's shape, and a reduction that always includes the target's value
(torch's `include_self=False` and `mean` are built from it by the frontend).
"""

from __future__ import annotations

from ..symbolic import equal
from ..types import TensorType
from . import shape_rules as rules
from .registry import REQUIRED, ShapeError, define


def _masked_scatter_rule(types: list[TensorType], attrs) -> list[TensorType]:
    x, mask, source = types
    if mask.dtype.value != "bool":
        raise ShapeError(f"masked_scatter mask must be bool, got {mask.dtype}")
    if source.dtype != x.dtype:
        raise ShapeError(f"masked_scatter source is {source.dtype}, the target is {x.dtype}")
    # torch broadcasts the target and the mask together (raises ShapeError when they do not)
    return [x.with_shape(rules.broadcast_shapes(x.shape, mask.shape))]


def _masked_scatter(x, mask, source):
    return x.masked_scatter(mask, source)


define("masked_scatter", "x mask source", _masked_scatter_rule, _masked_scatter, "indexing",
       "x (broadcast with mask) with its masked elements replaced, in order, by the leading "
       "elements of source")


# `scatter`'s reductions: how each combines the values landing on one element (the target's own
# value included; the frontend seeds the identity first where torch excludes it).
SCATTER_REDUCTIONS = ("none", "sum", "prod", "amax", "amin")


def _scatter_rule(types: list[TensorType], attrs) -> list[TensorType]:
    x, index, src = types
    if index.dtype.value not in ("i64", "i32"):
        raise ShapeError(f"scatter index must be an integer tensor, got {index.dtype}")
    if src.dtype != x.dtype:
        raise ShapeError(f"scatter src is {src.dtype}, the target is {x.dtype}")
    if not (x.rank == index.rank == src.rank):
        raise ShapeError(f"scatter needs x, index and src of one rank, got {x}, {index}, {src}")
    if any(not equal(a, b) for a, b in zip(index.shape, src.shape)):
        raise ShapeError(f"scatter src {src} must have the index's shape {index.shape}")
    rules.norm_axis(attrs["dim"], max(x.rank, 1))
    if attrs["reduce"] not in SCATTER_REDUCTIONS:
        raise ShapeError(f"scatter reduce must be one of {SCATTER_REDUCTIONS}, "
                         f"got {attrs['reduce']!r}")
    return [x]


def _scatter(x, index, src, dim, reduce):
    if reduce == "none":
        return x.scatter(dim, index, src)
    return x.scatter_reduce(dim, index, src, reduce, include_self=True)


define("scatter", "x index src", _scatter_rule, _scatter, "indexing",
       "x with src[i][j] written (reduce none) or combined (sum, prod, amax, amin, with x's own "
       "value) into x[index[i][j]][j] along dim; index and src have one shape", dim=REQUIRED,
       reduce="none")
