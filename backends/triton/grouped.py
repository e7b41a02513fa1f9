"""A Triton grouped-GEMM kernel for `grouped_matmul`: a mixture-of-experts layer's expert products.

`grouped_matmul(x, w, offsets)` multiplies row block g of x (offsets[g-1] <= row < offsets[g],
the token-expert pairs routed to expert g, sorted by expert) by w[g]; rows from offsets[-1] on
are zero. Only routed rows are computed: the FLOPs are the routed ones, 2 * pairs * k * n.

The host reads the offsets (one small int tensor per layer, as the op's torch reference does)
and lays out a tile schedule: every group's rows cut into tiles of BLOCK_M, each tile a (group,
first row, end row) triple. One program per (tile, block of BLOCK_N output columns) streams over
k in blocks of BLOCK_K, with fp32 accumulation and IEEE products whatever the input dtype, and
stores its rows; empty groups get no tile and rows past the last offset keep the zeros the
output starts with. Offsets that go backwards or past the rows are clamped as the reference
clamps them. NaN and Inf reach exactly the output rows whose products read them.

This module imports triton at import time: import it only after `backends.triton.device()` has
chosen between a CUDA device and the interpreter.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit
def _grouped(X, W, Out, TILE_GROUP, TILE_START, TILE_END, N, K, sxm, sxk, swg, swk, swn, som,
             son, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tile = tl.program_id(0)
    group = tl.load(TILE_GROUP + tile)
    start = tl.load(TILE_START + tile)
    end = tl.load(TILE_END + tile)
    offs_m = start + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = offs_m < end
    mn = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mk = offs_k < K
        a = tl.load(X + offs_m[:, None] * sxm + offs_k[None, :] * sxk,
                    mask=mm[:, None] & mk[None, :], other=0.0).to(tl.float32)
        b = tl.load(W + group * swg + offs_k[:, None] * swk + offs_n[None, :] * swn,
                    mask=mk[:, None] & mn[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(Out + offs_m[:, None] * som + offs_n[None, :] * son, acc.to(Out.dtype.element_ty),
             mask=mm[:, None] & mn[None, :])


def supported(x: Any, w: Any, offsets: Any) -> bool:
    """Float x and w of one dtype (the kernel's tiles need at least one row and column)."""
    return x.dtype == w.dtype and x.dtype in (torch.float32, torch.float16, torch.bfloat16) \
        and x.dim() == 2 and w.dim() == 3 and x.shape[0] > 0 and w.shape[2] > 0


def tile_schedule(offsets: list[int], rows: int, block_m: int) -> list[tuple[int, int, int]]:
    """(group, first row, end row) for every tile of at most `block_m` rows of every group."""
    tiles, start = [], 0
    for group, end in enumerate(offsets):
        end = min(max(end, start), rows)
        tiles += [(group, first, min(first + block_m, end)) for first in range(start, end, block_m)]
        start = end
    return tiles


def _blocks(device: str) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): small tiles in the interpreter, larger ones on a GPU."""
    return (16, 32, 32) if device == "cpu" else (64, 64, 32)


def grouped_matmul(x, w, offsets):
    """x [rows, k] with row block g times w[g] [k, n]; rows past offsets[-1] are zero."""
    out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = _blocks(x.device.type)
    tiles = tile_schedule([int(v) for v in offsets.tolist()], x.shape[0], block_m)
    if not tiles:
        return out
    group, first, end = (torch.tensor(column, dtype=torch.int32, device=x.device)
                         for column in zip(*tiles))
    grid = (len(tiles), triton.cdiv(w.shape[2], block_n))
    _grouped[grid](x, w, out, group, first, end, w.shape[2], w.shape[1], *x.stride(),
                   *w.stride(), *out.stride(), BLOCK_M=block_m, BLOCK_N=block_n,
                   BLOCK_K=block_k)
    return out
