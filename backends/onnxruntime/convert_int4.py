"""quantized_linear on dayzero's native MatMulInt4 kernel (native/int4_matmul.h).

The kernel runs int4 weights with int8-rounded activations (`quantize: {weights: int4,
activations: int8}`) and float16 scales (quantize_weights stores a float32 model's so), reading
18 bytes per 32 weights, where MatMulNBits reads 24 (its packed codes, a float32 scale and a
per-block sum); a decode step is bound by those bytes. It wants the codes and scales of each
tile of 8 output columns side by side. The artifact keeps MatMulNBits' layout (the portable
model and every other backend read it); the lowering reorders it with a Reshape and a
Transpose on the initializers, which ONNX Runtime's constant folding turns into new
initializers when the session loads, so the reorder costs load time only, and the original
tensors are dropped once nothing reads them.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import DType, Node

from .builder import Builder
from .native_ops import DOMAIN

TILE = 8     # output columns per tile
PAIR = 64    # inputs per pair of blocks: one 32-byte load per column


def int4_fits(node: Node) -> str | None:
    """None when MatMulInt4 computes this quantized_linear exactly, else why not."""
    a = node.attrs
    if (a["bits"], a["group_size"], a["activations"]) != (4, 32, "int8"):
        return "MatMulInt4 runs 4-bit weights in groups of 32 with int8 activations"
    x, qweight, scales = node.inputs[:3]
    if x.type.dtype != DType.f32 or scales.type.dtype != DType.f16:
        return "MatMulInt4 runs float32 with float16 scales"
    n, k = qweight.type.shape[0], a["in_features"]
    if not isinstance(n, int) or n % TILE or k % PAIR:
        return f"MatMulInt4 needs out_features a multiple of {TILE} and in_features of {PAIR}"
    if qweight.producer is not None or scales.producer is not None:
        return "the codes are computed in the graph: reordering them would run every call"
    return None


def matmul_int4(b: Builder, node: Node, x: list) -> list:
    """ai.dayzero.MatMulInt4 on codes [N/8, K/64, 8, 32] and float16 scales [N/8, K/32, 8]."""
    n, blocks = node.inputs[1].type.shape[:2]
    tiles = int(n) // TILE
    codes = b.op1("Transpose", [b.op1("Reshape", [x[1], b.ints([tiles, TILE, blocks // 2, 32])])],
                  perm=[0, 2, 1, 3])
    scales = b.op1("Transpose", [b.op1("Reshape", [x[2], b.ints([tiles, TILE, blocks])])],
                   perm=[0, 2, 1])
    return [b.op1("MatMulInt4", [x[0], codes, scales, x[3]], domain=DOMAIN)]


def tile_layout(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What `matmul_int4`'s folded Reshape + Transpose make of MatMulNBits' codes [N, K/32, 16]
    and scales [N * K/32], in NumPy: codes [N/8, K/64, 8, 32], scales [N/8, K/32, 8] (for
    tests and benchmarks that feed the kernel directly)."""
    n, blocks, _ = codes.shape
    tiles = codes.reshape(n // TILE, TILE, blocks // 2, 32).transpose(0, 2, 1, 3)
    return (np.ascontiguousarray(tiles),
            np.ascontiguousarray(scales.reshape(n // TILE, TILE, blocks).transpose(0, 2, 1)))
