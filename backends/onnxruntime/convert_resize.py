"""resize: torch's interpolate as ONNX Resize, with the coordinate mapping torch uses.

torch's bilinear without align_corners is ONNX's `pytorch_half_pixel`; with it, `align_corners`.
torch's legacy nearest takes floor(out_index * in / out): `asymmetric` with `floor` rounding.
Only the spatial axes are resized (`axes`), so the batch and channel sizes may be symbolic.
"""

from __future__ import annotations

from compiler.ir import Node

from .builder import Builder
from .convert_elementwise import Converter


def resize(b: Builder, node: Node, x: list) -> list:
    size = list(node.attrs["size"])
    axes = list(range(2, 2 + len(size)))
    if node.attrs["mode"] == "nearest":
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                 "nearest_mode": "floor"}
    else:
        corners = node.attrs["align_corners"]
        attrs = {"mode": "linear",
                 "coordinate_transformation_mode": "align_corners" if corners
                 else "pytorch_half_pixel"}
    return [b.op1("Resize", [x[0], None, None, b.dims(size)], axes=axes, **attrs)]


def table() -> dict[str, Converter]:
    return {"resize": resize}
