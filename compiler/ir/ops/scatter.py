"""Data-dependent merges whose result shape is still static: masked_scatter.

Vision-language models (LLaVA and its descendants) splice image features into the token sequence
where the prompt holds image placeholder tokens: `embeds.masked_scatter(mask, features)`. Which
positions receive features depends on the data, but the result has the shape of `embeds`, so the
op fits a static-shape IR and every backend can lower it (a cumulative sum of the mask gives each
masked position its index into the flattened source).
"""

from __future__ import annotations

from ..types import TensorType
from . import shape_rules as rules
from .registry import ShapeError, define


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
