"""A Triton kernel for `paged_attention`: a generation step's attention over a paged KV cache.

The op's decomposition gathers every token's whole slot list of keys and values and scores a
[T, kv_heads, group, L] tensor. Here one program per (token, kv head) holds the group of query
heads that share that kv head as one [group, head_size] tile, streams over the token's slot list
in blocks, loads each visible key and value row where it lives (a pool slot, or this step's new
key for slots <= -2) and keeps an online softmax, so nothing of size T x L is written. A first
small kernel rotates the step's new keys (the op's second output, which the second kernel reads
back for new-token slots, as the decomposition does). Accumulation is fp32 with IEEE products.

Semantics are the decomposition's (compiler/ir/ops/paged.py): hidden keys (past token_len,
before the window, slot -1) are never loaded; NaN or +Inf scores make their row NaN; NaN or Inf
in a visible value reaches the rows that weigh it (0 * Inf is NaN); a row with no visible key is
NaN, as the softmax of a row of -inf is.

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
def _rotated(X, C, S, offs_d, D, HALF, ROTARY: tl.constexpr):
    """Row X[offs_d] (fp32), times cos plus rotate_half(x) times sin when ROTARY."""
    md = offs_d < D
    x = tl.load(X + offs_d, mask=md, other=0.0).to(tl.float32)
    if ROTARY:
        partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
        other = tl.load(X + partner, mask=md, other=0.0).to(tl.float32)
        rot = tl.where(offs_d < HALF, -other, other)
        c = tl.load(C + offs_d, mask=md, other=0.0).to(tl.float32)
        s = tl.load(S + offs_d, mask=md, other=0.0).to(tl.float32)
        x = x * c + rot * s
    return x


@triton.jit
def _new_keys(K, V, COS, SIN, NEW_K, NEW_V, KV, D, DV, HALF,
              ROTARY: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    t = tl.program_id(0)
    g = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_DV)
    k = _rotated(K + (t * KV + g) * D, COS + t * D, SIN + t * D, offs_d, D, HALF, ROTARY)
    tl.store(NEW_K + (t * KV + g) * D + offs_d, k.to(NEW_K.dtype.element_ty), mask=offs_d < D)
    v = tl.load(V + (t * KV + g) * DV + offs_v, mask=offs_v < DV)
    tl.store(NEW_V + (t * KV + g) * DV + offs_v, v, mask=offs_v < DV)


@triton.jit
def _paged(Q, COS, SIN, K_CACHE, V_CACHE, NEW_K, NEW_V, SLOTS, TOKEN_SEQ, TOKEN_LEN, Out,
           H, KV, GROUP, D, DV, HALF, L, WINDOW, scale, softcap,
           ROTARY: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_G: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    t = tl.program_id(0)
    g = tl.program_id(1)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_DV)
    mg = offs_g < GROUP
    md = offs_d < D
    mv = offs_v < DV
    heads = g * GROUP + offs_g                                          # [G]
    rows = Q + (t * H + heads)[:, None] * D                            # [G, 1]
    q = tl.load(rows + offs_d[None, :], mask=mg[:, None] & md[None, :], other=0.0)
    q = q.to(tl.float32)
    if ROTARY:
        partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
        other = tl.load(rows + partner[None, :], mask=mg[:, None] & md[None, :], other=0.0)
        rot = tl.where(offs_d[None, :] < HALF, -other.to(tl.float32), other.to(tl.float32))
        c = tl.load(COS + t * D + offs_d, mask=md, other=0.0).to(tl.float32)
        s = tl.load(SIN + t * D + offs_d, mask=md, other=0.0).to(tl.float32)
        q = q * c[None, :] + rot * s[None, :]
    seq = tl.load(TOKEN_SEQ + t)
    seen = tl.load(TOKEN_LEN + t)
    end = tl.minimum(seen, L)
    begin = tl.maximum(seen - WINDOW, 0)  # WINDOW is 2^62 when the op has none
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], tl.float32)
    for start in range(begin, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        slot = tl.load(SLOTS + seq * L + offs_n, mask=offs_n < end, other=-1)
        visible = slot != -1
        pool = visible & (slot >= 0)
        new = visible & (slot < 0)
        pool_row = tl.where(pool, slot, 0) * KV + g
        new_row = tl.where(new, -2 - slot, 0) * KV + g
        k = tl.load(K_CACHE + pool_row[:, None] * D + offs_d[None, :],
                    mask=pool[:, None] & md[None, :], other=0.0)
        k += tl.load(NEW_K + new_row[:, None] * D + offs_d[None, :],
                     mask=new[:, None] & md[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale  # [G, N]
        if SOFTCAP:  # tanh(x) = 2 sigmoid(2x) - 1, as the generated kernels write it
            s = (2.0 * tl.sigmoid(2.0 * (s / softcap)) - 1.0) * softcap
        s = tl.where(visible[None, :], s, float("-inf"))
        # NaN wins the running max, as in softmax (max may drop a NaN operand on GPUs)
        row_nan = (m_i != m_i) | (tl.max(tl.where(s != s, 1, 0), axis=1) > 0)
        m_new = tl.where(row_nan, float("nan"), tl.maximum(m_i, tl.max(s, axis=1)))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(V_CACHE + pool_row[:, None] * DV + offs_v[None, :],
                    mask=pool[:, None] & mv[None, :], other=0.0)
        v += tl.load(NEW_V + new_row[:, None] * DV + offs_v[None, :],
                     mask=new[:, None] & mv[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]  # no visible key: 0 / 0, NaN as the decomposition's softmax
    tl.store(Out + (t * H + heads)[:, None] * DV + offs_v[None, :],
             out.to(Out.dtype.element_ty), mask=mg[:, None] & mv[None, :])


def _table(table: Any, tokens: int, size: int) -> Any | None:
    """The rotary table as [tokens, head_size] rows, or None when it differs between heads."""
    if table.dim() < 2 or any(d != 1 for d in table.shape[:-2]) or table.shape[-1] != size:
        return None
    return table.reshape(table.shape[-2:]).expand(tokens, size).contiguous()


def supported(q: Any, k: Any, v: Any, cos: Any, sin: Any, k_cache: Any, *, num_heads: int,
              kv_num_heads: int, **_: Any) -> bool:
    """Whether the kernel takes these operands: float, rotary tables shared by every head."""
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16) or k_cache.dtype != q.dtype:
        return False
    size = q.shape[-1] // num_heads
    tokens = q.shape[1]
    return cos is None or all(_table(t, tokens, size) is not None for t in (cos, sin))


def _blocks(device: str, group: int, size: int, v_size: int) -> tuple[int, int, int, int]:
    """(BLOCK_G, BLOCK_N, BLOCK_D, BLOCK_DV): tl.dot needs every dim >= 16."""
    return (max(16, triton.next_power_of_2(group)), 16 if device == "cpu" else 64,
            max(16, triton.next_power_of_2(size)), max(16, triton.next_power_of_2(v_size)))


def paged_attention(q, k, v, cos, sin, k_cache, v_cache, seq_slots, token_seq, token_len, *,
                    num_heads: int, kv_num_heads: int, scale: float | None = None,
                    window: int | None = None, softcap: float | None = None):
    """paged_attention with the Triton kernels: (attention [1, T, H * dv], rotated new keys
    [T, kv, d], new values [T, kv, dv])."""
    tokens = q.shape[1]
    heads, kv_heads = num_heads, kv_num_heads
    size, v_size = q.shape[-1] // heads, v.shape[-1] // kv_heads
    pool, length = k_cache.shape[0], seq_slots.shape[1]
    if seq_slots.numel() and (int(seq_slots.max()) >= pool or int(seq_slots.min()) < -1 - tokens):
        raise IndexError("paged_attention: a slot of seq_slots is outside the pool "
                         f"({pool} slots) and this step's {tokens} tokens")
    if token_seq.numel() and (int(token_seq.min()) < 0 or int(token_seq.max()) >= len(seq_slots)):
        raise IndexError("paged_attention: token_seq names a sequence that seq_slots lacks")
    q, k, v = (x.contiguous() for x in (q, k, v))
    k_cache, v_cache, seq_slots = (x.contiguous() for x in (k_cache, v_cache, seq_slots))
    token_seq, token_len = token_seq.contiguous(), token_len.contiguous()
    rotary = cos is not None
    cos, sin = (_table(t, tokens, size) for t in (cos, sin)) if rotary else (q, q)
    new_k = torch.empty((tokens, kv_heads, size), dtype=q.dtype, device=q.device)
    new_v = torch.empty((tokens, kv_heads, v_size), dtype=v.dtype, device=q.device)
    out = torch.empty((1, tokens, heads * v_size), dtype=q.dtype, device=q.device)
    if tokens == 0:
        return out, new_k, new_v
    block_g, block_n, block_d, block_dv = _blocks(q.device.type, heads // kv_heads, size,
                                                  v_size)
    _new_keys[(tokens, kv_heads)](k, v, cos, sin, new_k, new_v, kv_heads, size, v_size,
                                  size // 2, ROTARY=rotary, BLOCK_D=block_d, BLOCK_DV=block_dv)
    _paged[(tokens, kv_heads)](
        q, cos, sin, k_cache, v_cache, new_k, new_v, seq_slots, token_seq, token_len, out,
        heads, kv_heads, heads // kv_heads, size, v_size, size // 2, length,
        int(window or 1 << 62), 1.0 / math.sqrt(size) if scale is None else float(scale),
        float(softcap or 1.0),
        ROTARY=rotary, SOFTCAP=bool(softcap), BLOCK_G=block_g, BLOCK_N=block_n,
        BLOCK_D=block_d, BLOCK_DV=block_dv)
    return out, new_k, new_v
