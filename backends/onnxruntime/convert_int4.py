"""quantized_linear on dayzero's native MatMulInt4 kernel (native/int4_matmul.h).

The kernel runs int4 weights with int8-rounded activations (`quantize: {weights: int4,
activations: int8}`) and float16 scales (quantize_weights stores a float32 model's so), reading
18 bytes per 32 weights, where MatMulNBits reads 24 (its packed codes, a float32 scale and a
per-block sum); a decode step is bound by those bytes. It wants the codes and scales of each
tile of 8 output columns side by side: codes [N/8, K/64, 8, 32] and scales [N/8, K/32, 8]. The
artifact stores them so (`<codes>.int4_tiles8` and `<scales>.scale_tiles8`, layouts of
backends.base.WEIGHT_LAYOUTS, the scales' with parameter `rows` = N since a 1-D scales tensor
does not say it; asked for by the variant table's `layouts` and computed by the writer one
tensor at a time), so the kernel's initializers are external data pointing at those bytes: ONNX
Runtime maps them at load, nothing is transformed or copied. When the kernel is their only
reader MatMulNBits' layout is not stored; the portable model (MatMulNBits, or the
decomposition) then reads it back through Transpose + Reshape of the tiles, which ORT folds into
a copy at load (`lower.INVERSES`). Where the tiles were not stored (a segment lowered for
another backend's fallback), the kernel reads MatMulNBits' layout through the opposite Reshape +
Transpose, folded at load likewise.
"""

from __future__ import annotations

import numpy as np

from backends.base import INT4_TILE, WEIGHT_LAYOUTS
from compiler.ir import DType, Node

from .builder import Builder
from .native_ops import DOMAIN

TILE = INT4_TILE  # output columns per tile
PAIR = 64    # inputs per pair of blocks: one 32-byte load per column
CODE_TILES = "int4_tiles8"    # the stored layouts' names (backends.base.WEIGHT_LAYOUTS)
SCALE_TILES = "scale_tiles8"


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
    """ai.dayzero.MatMulInt4 on codes [N/8, K/64, 8, 32] and float16 scales [N/8, K/32, 8]:
    the stored tiles, or (none stored) folded at load from MatMulNBits' layout."""
    n, blocks = node.inputs[1].type.shape[:2]
    tiles = int(n) // TILE
    codes = b.stored_layout(node.inputs[1], CODE_TILES)
    if codes is None:
        codes = b.op1("Transpose", [b.op1("Reshape", [x[1], b.ints([tiles, TILE, blocks // 2,
                                                                     32])])], perm=[0, 2, 1, 3])
    scales = b.stored_layout(node.inputs[2], SCALE_TILES)
    if scales is None:
        scales = b.op1("Transpose", [b.op1("Reshape", [x[2], b.ints([tiles, TILE, blocks])])],
                       perm=[0, 2, 1])
    return [b.op1("MatMulInt4", [x[0], codes, scales, x[3]], domain=DOMAIN)]


def tile_layout(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tiles of MatMulNBits' codes [N, K/32, 16] and scales [N * K/32], in NumPy: codes
    [N/8, K/64, 8, 32], scales [N/8, K/32, 8], what the writer stores (for tests and
    benchmarks that feed the kernel directly)."""
    rows = int(codes.shape[0])
    return (WEIGHT_LAYOUTS[CODE_TILES].forward(codes),
            WEIGHT_LAYOUTS[SCALE_TILES].forward(scales, rows=rows))


def untile_codes(b: Builder, tiles: str, shape) -> str:
    """MatMulNBits' codes [N, K/32, 16] read back from their stored tiles (Transpose +
    Reshape, constant inputs only: ORT folds them into a copy at load)."""
    return b.op1("Reshape", [b.op1("Transpose", [tiles], perm=[0, 2, 1, 3]),
                             b.ints([int(d) for d in shape])])


def untile_scales(b: Builder, tiles: str, shape) -> str:
    """MatMulNBits' scales [N * K/32] read back from their stored tiles (folded likewise)."""
    return b.op1("Reshape", [b.op1("Transpose", [tiles], perm=[0, 2, 1]),
                             b.ints([int(d) for d in shape])])
