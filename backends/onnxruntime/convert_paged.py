"""paged_attention on dayzero's native PagedAttention kernel (see native_ops, native/paged_op.cc).

The op's decomposition gathers every token's whole slot list of keys and values ([T, L, kv_heads,
head_size] each) and scores a [T, kv_heads, group, L] tensor; for a decode step against a long
cache that is almost all copying. `ai.dayzero.PagedAttention` takes the op's own operands and
reads each visible key where it lives, with an online softmax per token and head.

It fits float32 nodes within the kernel's size limits whose rotary tables, if any, give one
full-width row per token shared by every head (the kernel reads row t for token t). Anything
else, and every node where the library is missing, lowers through the decomposition; an artifact
compiled with the kernel carries a portable model for machines without it (see native_ops).
"""

from __future__ import annotations

import math

from compiler.ir import DType, Node
from compiler.ir.symbolic import equal

from .builder import Builder
from .convert_heads import packed_source
from .native_ops import DOMAIN as NATIVE_DOMAIN

# What ai.dayzero.PagedAttention accepts: native/paged_attention.h's kPagedMaxHeadSize and
# kPagedMaxHeads (a test checks they are equal), so that a node never compiles onto the kernel
# and then fails on every call.
PAGED_MAX_HEAD_SIZE = 1024
PAGED_MAX_HEADS = 1024
_MAX_WINDOW = (1 << 63) - 1  # an int64 attribute


def _table_misfit(node: Node) -> str | None:
    """None when the rotary tables (if any) are one [head_size] row per token for every head."""
    q, cos = node.inputs[0], node.inputs[3]
    if cos is None:
        return None
    size = q.shape[-1] // node.attrs["num_heads"]
    shape = cos.shape
    for table in (cos, node.inputs[4]):
        if table.type.rank < 2 or any(d != 1 for d in table.shape[:-2]):
            return "PagedAttention takes one rotary row per token, the same for every head"
        if table.shape != shape:
            return "the cos and sin tables differ in shape"
    if not equal(shape[-2], q.shape[1]) or shape[-1] != size:
        return "the rotary tables are not [tokens, head_size]"
    return None


def paged_fits(node: Node) -> str | None:
    """None when dayzero's PagedAttention kernel computes this node exactly, else why not."""
    q, _, v = node.inputs[:3]
    if any(x.dtype != DType.f32 for x in (q, *node.inputs[5:7])):
        return "PagedAttention runs float32"
    heads, kv_heads = node.attrs["num_heads"], node.attrs["kv_num_heads"]
    if heads > PAGED_MAX_HEADS:
        return f"PagedAttention takes at most {PAGED_MAX_HEADS} heads"
    if max(q.shape[-1] // heads, v.shape[-1] // kv_heads) > PAGED_MAX_HEAD_SIZE:
        return f"PagedAttention takes head sizes up to {PAGED_MAX_HEAD_SIZE}"
    scale, softcap, window = (node.attrs[a] for a in ("scale", "softcap", "window"))
    if not all(x is None or math.isfinite(x) for x in (scale, softcap)):
        return "PagedAttention takes a finite scale and softcap"
    if window is not None and window > _MAX_WINDOW:
        return "the window does not fit an int64 attribute"
    return _table_misfit(node)


def paged_attention(b: Builder, node: Node, x: list) -> list:
    """ai.dayzero.PagedAttention: the op's operands, tables as [tokens, head_size], every
    attribute explicit (0 for no window and no softcap); q, k and v cut from one merged
    projection (equal key and value widths) go in packed, as the projection itself."""
    q, k, v, cos, sin, *rest = x
    query = node.inputs[0]
    size = query.shape[-1] // node.attrs["num_heads"]
    if cos is not None and node.inputs[3].type.rank != 2:
        shape = b.dims([query.shape[1], size])
        cos, sin = (b.op1("Reshape", [t, shape]) for t in (cos, sin))
    packed = packed_source(b, node)
    if packed is not None and node.inputs[1].shape[-1] == node.inputs[2].shape[-1]:
        q, k, v = packed, None, None  # [q | k | v] of one projection, read in place
    scale = node.attrs["scale"]
    return b.op("PagedAttention", [q, k, v, cos, sin, *rest], 3, domain=NATIVE_DOMAIN,
                num_heads=node.attrs["num_heads"], kv_num_heads=node.attrs["kv_num_heads"],
                scale=float(1.0 / math.sqrt(size) if scale is None else scale),
                window=int(node.attrs["window"] or 0),
                softcap=float(node.attrs["softcap"] or 0.0))
