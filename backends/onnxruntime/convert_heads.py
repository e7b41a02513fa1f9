"""multi_head_attention on dayzero's CausalAttention or ONNX Runtime's GroupQueryAttention kernel.

GroupQueryAttention (com.microsoft) takes the [batch, seq, heads * head_size] projections as the
linears produce them, shares each KV head among its group of query heads without repeating it,
applies the rotary embedding to q and k itself, and is causal by construction. For a decoder's
prompt that is the whole attention block in one kernel: no head transposes, no repeat_kv copies,
no slice/neg/concat rotary ops.

It fits a node when the attention is causal with no other mask over equal query and key lengths
(a sliding window and logit softcapping included: `local_window_size`, `softcap`)
(GQA's prompt case: no past, `seqlens_k` = length - 1 and `total_sequence_length` = length), and,
with rotary, when ORT's half-width cos/sin cache can be cut from the graph's tables: one row per
position shared by every batch and head, whose two halves are provably equal (transformers build
them as cos(concat(freqs, freqs))). The kernel reads cache row i for token i, and row i of the
graph's own table is what token i was rotated with, so positions need not be 0..S-1.
dayzero's own `ai.dayzero.CausalAttention` (see native_ops) takes the same operands and fits
the same nodes (any head size, float32 only); it is preferred where built, since it skips the
masked half of the score matrix that GQA computes.
Otherwise, without rotary, MultiHeadAttention takes the same [b, s, h * d] projections (KV heads
repeated in that layout when fewer), with any mask as its attention_bias: the encoders' case
(BERT's padding mask, ViT). Anything else lowers through the op's decomposition.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.ir import DType, Node, Value, get_op
from compiler.ir.symbolic import equal

from .builder import ONNX_DTYPES, Builder
from .convert_attention import CAUSAL_MHA, attention_bias, mask_terms
from .native_ops import DOMAIN as NATIVE_DOMAIN

MS = "com.microsoft"
# What ai.dayzero.CausalAttention accepts: native/causal_attention.h's kMaxHeadSize, kMaxHeads
# and kMaxSequence (a test checks they are equal). The fit check refuses the rest, so that a
# node never compiles onto the kernel and then fails on every call.
CAUSAL_MAX_HEAD_SIZE = 1024
CAUSAL_MAX_HEADS = 1024
CAUSAL_MAX_SEQUENCE = 1 << 24
_MAX_DEPTH = 32
# ops that keep every row of the last dim intact, so equal halves stay equal (given the other
# operands either have equal halves too or broadcast along the last dim)
_ROW_PRESERVING_KINDS = frozenset({"elementwise"})
_ROW_PRESERVING_VIEWS = frozenset({"reshape", "expand", "permute", "slice", "select", "cast"})


def _prompt_misfit(node: Node, kernel: str) -> str | None:
    """None when `node` is a causal prompt without past or extra mask whose rotary tables (if
    any) can be cut to a half cache: what GQA and CausalAttention both compute."""
    q, k, _, cos, sin, mask = node.inputs
    if node.attrs["scale"] == 0:
        return f"{kernel} reads scale 0 as 1 / sqrt(head_size)"
    if not node.attrs["is_causal"] or mask is not None:
        return f"{kernel} is causal attention without an extra mask"
    if not equal(q.shape[1], k.shape[1]):
        return f"query and key lengths may differ ({kernel} takes a prompt without past)"
    for table in (cos, sin):
        why = table is not None and _table_misfit(node, table)
        if why:
            return why
    return None


def causal_fits(node: Node) -> str | None:
    """None when dayzero's CausalAttention kernel computes this node exactly, else why not."""
    q = node.inputs[0]
    if q.dtype != DType.f32:
        return "CausalAttention runs float32"
    if node.attrs["window"] is not None or node.attrs["softcap"] is not None:
        return "CausalAttention has no sliding window or softcap (GroupQueryAttention has both)"
    heads = node.attrs["num_heads"]
    if heads > CAUSAL_MAX_HEADS:
        return f"CausalAttention takes at most {CAUSAL_MAX_HEADS} heads"
    if q.shape[-1] // heads > CAUSAL_MAX_HEAD_SIZE:
        return f"CausalAttention takes head sizes up to {CAUSAL_MAX_HEAD_SIZE}"
    if isinstance(q.shape[1], int) and q.shape[1] > CAUSAL_MAX_SEQUENCE:
        return f"CausalAttention takes sequences up to {CAUSAL_MAX_SEQUENCE} tokens"
    return _prompt_misfit(node, "CausalAttention")


def gqa_fits(node: Node) -> str | None:
    """None when GroupQueryAttention computes this node exactly, else why not."""
    q = node.inputs[0]
    if q.dtype not in (DType.f32, DType.f16):
        return "GroupQueryAttention runs float32 and float16"
    if (q.shape[-1] // node.attrs["num_heads"]) % 16:
        return "ORT's GroupQueryAttention CPU kernel needs a head size that is a multiple of 16"
    return _prompt_misfit(node, "GroupQueryAttention")


def _table_misfit(node: Node, table: Value) -> str | None:
    q = node.inputs[0]
    size = q.shape[-1] // node.attrs["num_heads"]
    shape = table.shape
    if table.type.rank < 2 or any(d != 1 for d in shape[:-2]):
        return "the rotary table differs between batch rows or heads"
    if not equal(shape[-2], q.shape[1]) or shape[-1] != size:
        return "the rotary table is not [positions, head_size]"
    if not equal_halves(table):
        return "the rotary table's two halves are not provably equal (ORT caches one half)"
    return None


def equal_halves(value: Value, depth: int = 0) -> bool:
    """True when the last dim of `value` is provably two equal halves: concat(a, a) on the last
    dim, carried through ops that keep each last-dim row intact (elementwise math with operands
    of equal halves or broadcast along that dim, views that keep the last dim last)."""
    node = value.producer
    if node is None or depth > _MAX_DEPTH or value.type.rank == 0:
        return False
    rank = value.type.rank
    if node.op == "concat":
        same = len(node.inputs) == 2 and node.inputs[0] is node.inputs[1]
        return same and node.attrs["dim"] % rank == rank - 1
    if node.op in _ROW_PRESERVING_VIEWS:
        return _keeps_last_dim(node) and equal_halves(node.inputs[0], depth + 1)
    if get_op(node.op).kind not in _ROW_PRESERVING_KINDS or len(node.outputs) != 1:
        return False
    halves = [v for v in node.inputs if v is not None and not _broadcast_last(v)]
    return bool(halves) and all(equal_halves(v, depth + 1) for v in halves)


def _broadcast_last(value: Value) -> bool:
    return value.type.rank == 0 or value.shape[-1] == 1


def _keeps_last_dim(node: Node) -> bool:
    x, out = node.inputs[0], node.outputs[0]
    if x.type.rank == 0 or out.type.rank == 0 or not equal(x.shape[-1], out.shape[-1]):
        return False
    if node.op == "permute":
        return node.attrs["dims"][-1] % x.type.rank == x.type.rank - 1
    if node.op in ("slice", "select"):
        return node.attrs["dim"] % x.type.rank != x.type.rank - 1
    return True


def _prompt_operands(b: Builder, node: Node, x: list) -> tuple[list, dict]:
    """Inputs [q, k, v, cos_cache, sin_cache] (k and v None when q is the packed projection) and
    the head attributes, as GroupQueryAttention and CausalAttention both take them."""
    q, k, v, cos, sin, _ = x
    heads = node.attrs["num_heads"]
    size = node.inputs[0].shape[-1] // heads
    seq = node.inputs[0].shape[1]
    caches = [None, None]
    if cos is not None:
        caches = [_half_cache(b, table, name, seq, size)
                  for table, name in ((node.inputs[3], cos), (node.inputs[4], sin))]
    packed = packed_source(b, node)
    if packed is not None:  # q, k, v are consecutive slices of one projection: read it whole
        q, k, v = packed, None, None
    scale = node.attrs["scale"]
    attrs = dict(num_heads=heads, kv_num_heads=node.attrs["kv_num_heads"],
                 scale=float(1.0 / math.sqrt(size) if scale is None else scale),
                 rotary_interleaved=0)
    return [q, k, v, *caches], attrs


def causal_attention(b: Builder, node: Node, x: list) -> list:
    """ai.dayzero.CausalAttention: GQA's operands without the length inputs."""
    inputs, attrs = _prompt_operands(b, node, x)
    return [b.op1("CausalAttention", inputs, domain=NATIVE_DOMAIN, **attrs)]


def _window_softcap(node: Node) -> dict:
    """GroupQueryAttention's local_window_size and softcap for the node's window and softcap.

    ORT's CPU kernel (1.32) keeps the last local_window_size keys of each query's causal row,
    its own included: query i sees keys i - local_window_size < j <= i, exactly dayzero's (and
    transformers') window, measured against the reference (tests/backends/
    test_onnxruntime_heads.py, window 1 and 4), although ORT's docs call it the "left window
    size". -1 and 0.0 are ORT's "off". GQA softcaps the scaled scores, as transformers do.
    """
    window, softcap = node.attrs["window"], node.attrs["softcap"]
    return dict(local_window_size=-1 if window is None else window,
                softcap=0.0 if softcap is None else float(softcap))


def gqa(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.GroupQueryAttention for the prompt: causal, no past, maybe rotary, maybe a
    sliding window and softcapping."""
    (q, k, v, *caches), attrs = _prompt_operands(b, node, x)
    attrs.update(_window_softcap(node))
    query = node.inputs[0]
    total, seqlens = b.memo(("gqa-lengths", query.shape[0], query.shape[1]),
                            lambda: _lengths(b, query.shape[0], query.shape[1]))
    outs = b.op("GroupQueryAttention", [q, k, v, None, None, seqlens, total, *caches], 3,
                domain=MS, unused=(1, 2), do_rotary=int(caches[0] is not None), **attrs)
    return [outs[0]]


def _lengths(b: Builder, batch, seq) -> tuple[str, str]:
    """GQA's `total_sequence_length` ([1] int32: the kernel takes a one-element vector) and
    `seqlens_k` ([batch] int32, length - 1 for every row), in as few nodes as the sizes allow."""
    total = b.op1("Cast", [b.dims([seq])], to=ONNX_DTYPES[DType.i32])
    seqlens = b.op1("Add", [total, b.const(np.asarray([-1], dtype=np.int32), DType.i32)])
    if batch != 1:
        seqlens = b.op1("Expand", [seqlens, b.dims([batch])])
    return total, seqlens


def packed_source(b: Builder, node: Node) -> str | None:
    """The ONNX name of the merged QKV projection when q, k and v are its [q | k | v] slices
    along the last dim in that order, covering it exactly (GQA and dayzero's PagedAttention then
    take it packed and no Split runs); None otherwise."""
    slices = [v.producer for v in node.inputs[:3]]
    if any(s is None or s.op != "slice" for s in slices):
        return None
    source = slices[0].inputs[0]
    if any(s.inputs[0] is not source for s in slices) or source.type.rank != 3:
        return None
    start = 0
    for s in slices:
        a = s.attrs
        if a["dim"] % 3 != 2 or a["step"] != 1 or a["start"] != start:
            return None
        start = s.outputs[0].shape[-1] + start
    if start != source.shape[-1]:
        return None
    return b.value_names.get(id(source))


def _half_cache(b: Builder, value: Value, table: str, seq, size: int) -> str:
    """ORT's [positions, head_size / 2] cache: the first half of each row of the table; a
    constant computed at the longest sequence when the table provably allows it (GQA reads
    rows by position, so extra rows are never read), else cut from the table per call."""
    rows = b.position_tables.table(value)
    if rows is not None:
        rows = rows.reshape(-1, size)
        if np.array_equal(rows[:, :size // 2], rows[:, size // 2:]):
            return b.const(np.ascontiguousarray(rows[:, :size // 2]), value.dtype)

    def make():
        half = b.op1("Slice", [table, b.ints([0]), b.ints([size // 2]), b.ints([-1])])
        return b.op1("Reshape", [half, b.dims([seq, size // 2])])
    return b.memo(("rotary-half-cache", table), make)


def mha_fits(node: Node) -> str | None:
    """None when MultiHeadAttention on [b, s, h * d] computes this node exactly, else why not."""
    q, k, _, cos, _, mask = node.inputs
    if node.attrs["scale"] == 0:
        return "MultiHeadAttention reads scale 0 as 1 / sqrt(head_size)"
    if cos is not None:
        return "rotary runs inside GroupQueryAttention only"
    if q.dtype != DType.f32:
        return "MultiHeadAttention's CPU kernel is float32 only"
    if node.attrs["softcap"] is not None:
        return "MultiHeadAttention has no softcap"
    if node.attrs["is_causal"]:
        return CAUSAL_MHA
    if mask is not None:
        if mask.type.rank > 4 or not (mask.dtype.is_float or mask.dtype == DType.bool):
            return "the mask is not a bool or float mask of rank <= 4"
        if mask.type.rank >= 3 and mask.shape[-3] != 1:
            return "the mask differs between heads"
    return None


def mha(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.MultiHeadAttention with q, k, v as [b, s, h * d], no transposes."""
    q, k, v, _, _, mask = x
    query, key = node.inputs[0], node.inputs[1]
    heads = node.attrs["num_heads"]
    size = query.shape[-1] // heads
    k, v = (_repeat_heads(b, node, name, i) for i, name in ((1, k), (2, v)))
    bias, valid = mask_terms(b, node, mask, index=5)
    if bias is not None:
        bias = attention_bias(b, node.inputs[5].type, query.shape[1], key.shape[1], bias)
    scale = node.attrs["scale"]
    out = b.op1("MultiHeadAttention", [q, k, v, None, None, bias], domain=MS, num_heads=heads,
                scale=float(1.0 / math.sqrt(size) if scale is None else scale))
    if valid is None:
        return [out]
    rank = node.inputs[5].type.rank  # valid is the mask's shape with the key axis 1
    if rank < 4:
        valid = b.op1("Unsqueeze", [valid, b.ints(list(range(4 - rank)))])
    return [b.op1("Mul", [out, b.op1("Squeeze", [valid, b.ints([1])])])]


def _repeat_heads(b: Builder, node: Node, name: str, index: int) -> str:
    """k or v [b, l, hkv * d] with each KV head repeated for its group of query heads."""
    heads, kv_heads = node.attrs["num_heads"], node.attrs["kv_num_heads"]
    if heads == kv_heads:
        return name
    value = node.inputs[index]
    batch, length, width = value.shape
    size, rep = width // kv_heads, heads // kv_heads
    split = b.op1("Reshape", [name, b.dims([batch, length, kv_heads, 1, size])])
    wide = b.op1("Expand", [split, b.dims([batch, length, kv_heads, rep, size])])
    return b.op1("Reshape", [wide, b.dims([batch, length, heads * size])])
