"""Spatial resizing (`F.interpolate`): the resize step of image preprocessing.

`size` is the output's trailing spatial sizes (static: preprocessing resizes to the model's input
resolution from whatever the image was); the leading dims (batch, channels) pass through.
`mode` is torch's: "nearest" (torch's legacy nearest, index = floor(out * in / out_size)) or
"bilinear" with `align_corners`. torch's antialiased downsampling is a different algorithm and is
not this op.
"""

from __future__ import annotations

from ..types import TensorType
from .registry import REQUIRED, ShapeError, define

MODES = {"nearest": 1, "bilinear": 2}  # mode -> number of spatial dims it resizes


def _resize_rule(types: list[TensorType], attrs) -> list[TensorType]:
    x = types[0]
    mode, size = attrs["mode"], list(attrs["size"])
    if mode not in MODES:
        raise ShapeError(f"resize mode '{mode}' is not one of {sorted(MODES)}")
    if not x.dtype.is_float:
        raise ShapeError(f"resize needs a float input, got {x.dtype}")
    if mode == "bilinear" and len(size) != 2:
        raise ShapeError(f"bilinear resize takes 2 spatial sizes, got {size}")
    if x.rank != len(size) + 2:
        raise ShapeError(f"resize of {x} to {len(size)} spatial dims needs rank {len(size) + 2}")
    if mode == "nearest" and attrs["align_corners"]:
        raise ShapeError("nearest resize has no align_corners")
    return [x.with_shape(x.shape[:2] + tuple(size))]


def _resize(x, size, mode, align_corners):
    import torch.nn.functional as F

    return F.interpolate(x, size=list(size), mode=mode,
                         align_corners=align_corners if mode == "bilinear" else None)


define("resize", "x", _resize_rule, _resize, "pooling",
       "resample the trailing spatial dims to `size` (torch's interpolate)", size=REQUIRED,
       mode=REQUIRED, align_corners=False)
