"""A flash-style Triton kernel for `scaled_dot_product_attention` (4-d q/k/v).

One program per (batch*head, block of queries) streams over the keys in blocks with an online
softmax (running max and sum), so the [Lq, Lk] score matrix is never written to memory. Masks
(boolean or additive, broadcast via strides), causal masking (top-left aligned, as torch does;
with a sliding window, query i sees keys i - window < j <= i) and grouped-query heads
(`enable_gqa`: query head h reads key/value head h // group) are handled in the kernel.
Accumulation is fp32 with IEEE dot products, whatever the input dtype. Logit softcapping
(`softcap`) is not in the kernel: `supported` refuses it and the executable runs the op's torch
reference instead.

This module imports triton at import time: import it only after `backends.triton.device()` has
chosen between a CUDA device and the interpreter.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit
def _attention(Q, K, V, M, Out, sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
               smb, smh, smm, smn, sob, soh, som, sod, H, GROUP, LQ, LK, D, scale, WINDOW,
               HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_WINDOW: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mm = offs_m < LQ
    md = offs_d < D
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=mm[:, None] & md[None, :], other=0.0).to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, LK, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mn = offs_n < LK
        kv_mask = mn[:, None] & md[None, :]
        k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :] * skd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        valid = mm[:, None] & mn[None, :]
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        if HAS_WINDOW:
            valid = valid & (offs_n[None, :] > offs_m[:, None] - WINDOW)
        if HAS_MASK:
            mv = tl.load(M + b * smb + h * smh + offs_m[:, None] * smm + offs_n[None, :] * smn,
                         mask=mm[:, None] & mn[None, :], other=0)
            if MASK_BOOL:
                valid = valid & (mv != 0)
            else:
                s = s + mv.to(tl.float32)
        s = tl.where(valid, s, float("-inf"))
        # NaN wins the running max, as in softmax: max and maximum may drop a NaN operand
        # (on GPUs), so a row that has seen a NaN score is made NaN explicitly
        row_nan = (m_i != m_i) | (tl.max(tl.where(s != s, 1, 0), axis=1) > 0)
        m_new = tl.where(row_nan, float("nan"), tl.maximum(m_i, tl.max(s, axis=1)))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :] * svd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    # a row with every key masked out (l_i exactly 0) is 0, as torch returns it; a NaN row stays
    # NaN (l_i > 0 is false for NaN too); rows past LQ are not stored
    out = tl.where(l_i[:, None] != 0, acc / tl.where(l_i != 0, l_i, 1.0)[:, None], 0.0)
    tl.store(Out + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
             out.to(Out.dtype.element_ty), mask=mm[:, None] & md[None, :])


def _blocks(device: str, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D): small blocks in the interpreter, larger ones on a GPU."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    return (16, 16, block_d) if device == "cpu" else (64, 64, block_d)


def supported(q: Any, k: Any, v: Any, softcap: float | None = None) -> bool:
    """Whether the kernel takes these operands (4-d, one head size, float) and no softcap."""
    return q.dim() == k.dim() == v.dim() == 4 and q.shape[-1] == k.shape[-1] == v.shape[-1] \
        and q.dtype in (torch.float32, torch.float16, torch.bfloat16) \
        and q.shape[1] % k.shape[1] == 0 and softcap is None


def attention(q, k, v, mask=None, *, is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False, window: int | None = None,
              softcap: float | None = None):
    """scaled_dot_product_attention(q, k, v, mask) with the flash kernel; q/k/v [B, H, L, D]."""
    del enable_gqa  # heads are grouped whenever k has fewer heads than q (checked by the IR)
    if softcap is not None:
        raise ValueError("the triton attention kernel has no softcap (see `supported`)")
    batch, heads, lq, dim = q.shape
    lk = k.shape[2]
    out = torch.empty_like(q)
    if mask is None:
        mask_arg, mstrides = q, (0, 0, 0, 0)
    else:
        mask_arg = mask.expand(batch, heads, lq, lk)
        mstrides = mask_arg.stride()
    block_m, block_n, block_d = _blocks(q.device.type, dim)
    grid = (batch * heads, triton.cdiv(lq, block_m))
    _attention[grid](q, k, v, mask_arg, out, *q.stride(), *k.stride(), *v.stride(), *mstrides,
                     *out.stride(), heads, heads // k.shape[1], lq, lk, dim,
                     1.0 / math.sqrt(dim) if scale is None else float(scale),
                     0 if window is None else int(window), HAS_MASK=mask is not None,
                     MASK_BOOL=mask is not None and mask.dtype == torch.bool, CAUSAL=is_causal,
                     HAS_WINDOW=is_causal and window is not None,
                     BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d)
    return out
