"""linear on dayzero's native PackedLinear kernel (native/packed_linear.h).

The kernel wants the [out, in] float32 weight in panels of 32 output columns, each panel stored
input-major ([out / 32, in, 32]), so that a decode step streams each panel front to back and a
prompt chunk's tile of 8 rows reads 32 columns' weights with two loads. The artifact stores the
weight in that layout (`<weight>.panels32`, layout `panels32` of backends.base.WEIGHT_LAYOUTS,
asked for by the variant table's `layouts` and computed by the writer one tensor at a time), so
the kernel's initializer is external data pointing at those bytes: ONNX Runtime maps them at
load, nothing is transformed or copied. When the kernel is the weight's only reader the torch
layout is not stored; the portable model (and any other reader) then reads it back through
Transpose + Reshape of the panels, which ORT folds into a copy at load (`lower`). Where the
panels were not stored (a segment lowered for another backend's fallback), the kernel reads
the torch layout through the opposite Reshape + Transpose, folded at load likewise.

Every row of x goes through the same fused multiply-adds in the same order whatever else is in
the call, so a sequence's answer does not depend on what it is batched with.
"""

from __future__ import annotations

import numpy as np

from backends.base import WEIGHT_LAYOUTS
from compiler.ir import DType, Node

from .builder import Builder
from .native_ops import DOMAIN

PANEL = 32  # output columns per panel (backends.base.PANEL)
PANELS = "panels32"  # the stored layout's name (backends.base.WEIGHT_LAYOUTS)


def packed_linear_fits(node: Node) -> str | None:
    """None when PackedLinear computes this linear, else why not."""
    x, weight = node.inputs[:2]
    if x.type.dtype != DType.f32 or weight.type.dtype != DType.f32:
        return "PackedLinear runs float32"
    if x.type.rank > 4:
        return "PackedLinear takes x of rank 1 to 4"
    n, k = weight.type.shape
    if not isinstance(k, int) or not isinstance(n, int) or n % PANEL:
        return f"PackedLinear needs out_features a multiple of {PANEL}"
    if weight.producer is not None:
        return "the weight is computed in the graph: packing it would run every call"
    return None


def packed_linear(b: Builder, node: Node, x: list) -> list:
    """ai.dayzero.PackedLinear on panels [N/32, K, 32]: the stored panels, or (none stored)
    folded at load from the [N, K] weight."""
    n, k = (int(d) for d in node.inputs[1].type.shape)
    panels = b.stored_layout(node.inputs[1], PANELS)
    if panels is None:
        panels = b.op1("Transpose", [b.op1("Reshape", [x[1], b.ints([n // PANEL, PANEL, k])])],
                       perm=[0, 2, 1])
    inputs = [x[0], panels] + ([x[2]] if x[2] is not None else [])
    return [b.op1("PackedLinear", inputs, domain=DOMAIN)]


def panel_layout(weight: np.ndarray) -> np.ndarray:
    """The panels of a [N, K] weight, in NumPy: what the writer stores (for tests and
    benchmarks that feed the kernel directly)."""
    return WEIGHT_LAYOUTS[PANELS].forward(weight)


def unpanel(b: Builder, panels: str, shape) -> str:
    """The [N, K] weight read back from its stored panels (Transpose + Reshape, constant
    inputs only: ORT folds them into a copy at load)."""
    return b.op1("Reshape", [b.op1("Transpose", [panels], perm=[0, 2, 1]),
                             b.ints([int(d) for d in shape])])
