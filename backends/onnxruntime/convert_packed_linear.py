"""linear on dayzero's native PackedLinear kernel (native/packed_linear.h).

The kernel wants the [out, in] float32 weight in panels of 32 output columns, each panel stored
input-major ([out / 32, in, 32]), so that a decode step streams each panel front to back and a
prompt chunk's tile of 8 rows reads 32 columns' weights with two loads. The artifact keeps
torch's layout (the portable model and every other backend read it); the lowering reorders it
with a Reshape and a Transpose on the initializer, which ONNX Runtime's constant folding turns
into a new initializer when the session loads (as MatMulInt4's tiles, see convert_int4), so the
reorder costs load time only and the original tensor is dropped once nothing reads it (the
session's creation ends with a heap trim, so its pages go back; while ORT folds, the load peaks
at about twice the float32 linear weights: docs/backends.md).

Every row of x goes through the same fused multiply-adds in the same order whatever else is in
the call, so a sequence's answer does not depend on what it is batched with.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import DType, Node

from .builder import Builder
from .native_ops import DOMAIN

PANEL = 32  # output columns per panel


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
    """ai.dayzero.PackedLinear on panels [N/32, K, 32] folded from the [N, K] weight."""
    n, k = (int(d) for d in node.inputs[1].type.shape)
    panels = b.op1("Transpose", [b.op1("Reshape", [x[1], b.ints([n // PANEL, PANEL, k])])],
                   perm=[0, 2, 1])
    inputs = [x[0], panels] + ([x[2]] if x[2] is not None else [])
    return [b.op1("PackedLinear", inputs, domain=DOMAIN)]


def panel_layout(weight: np.ndarray) -> np.ndarray:
    """What `packed_linear`'s folded Reshape + Transpose make of a [N, K] weight, in NumPy (for
    tests and benchmarks that feed the kernel directly)."""
    n, k = weight.shape
    return np.ascontiguousarray(weight.reshape(n // PANEL, PANEL, k).transpose(0, 2, 1))
