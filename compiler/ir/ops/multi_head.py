"""multi_head_attention: attention on [batch, seq, heads * head_size] projections.

Transformers split each projection into heads (`reshape` to [b, s, h, d], `permute` to
[b, h, s, d]), rotate q and k (rotary embedding), attend, and merge the heads back (`permute`,
`reshape`). In that layout every head split and merge is a transpose that a backend has to run as
a copy. This op keeps the projections in the layout the linears produce, so a backend with a
fused kernel for the whole block (dayzero's native CausalAttention, ONNX Runtime's
GroupQueryAttention or MultiHeadAttention, which take [b, s, h * d] directly and apply the
rotary themselves) runs no transposes at all.

Its meaning is its decomposition: exactly the split / rotary / scaled_dot_product_attention /
merge nodes it replaces, so every backend without a kernel lowers those instead.
"""

from __future__ import annotations

from ..symbolic import equal
from ..types import TensorType
from . import shape_rules as rules
from .fused import Emitter, _reference, decomposes
from .nn import check_window_softcap
from .registry import REQUIRED, ShapeError, define

# [b, s, h, d] <-> [b, h, s, d]
HEADS_FIRST = [0, 2, 1, 3]


def _head_size(x: TensorType, heads: int, what: str) -> int:
    width = x.shape[-1]
    if not isinstance(width, int) or width % heads:
        raise ShapeError(f"multi_head_attention: {what} width {width} is not a multiple of "
                         f"{heads} heads")
    return width // heads


def _check_heads(attrs) -> tuple[int, int]:
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    if not (isinstance(heads, int) and isinstance(kv_heads, int) and heads > 0 and kv_heads > 0
            and heads % kv_heads == 0):
        raise ShapeError(f"multi_head_attention: num_heads {heads} must be a positive multiple "
                         f"of kv_num_heads {kv_heads}")
    return heads, kv_heads


def _split_shape(x: TensorType, heads: int, size: int) -> tuple:
    return (x.shape[0], heads, x.shape[1], size)


def _rule(types, attrs):
    q, k, v, cos, sin, mask = types
    rules.same_dtype([q, k, v], "multi_head_attention")
    if q.rank != 3 or k.rank != 3 or v.rank != 3:
        raise ShapeError(f"multi_head_attention: q {q}, k {k}, v {v} must be "
                         "[batch, seq, heads * head_size]")
    heads, kv_heads = _check_heads(attrs)
    size = _head_size(q, heads, "query")
    if _head_size(k, kv_heads, "key") != size:
        raise ShapeError(f"multi_head_attention: key head size differs from the query's {size}")
    v_size = _head_size(v, kv_heads, "value")
    if not (equal(q.shape[0], k.shape[0]) and equal(k.shape[0], v.shape[0])
            and equal(k.shape[1], v.shape[1])):
        raise ShapeError(f"multi_head_attention: q {q}, k {k} and v {v} disagree on batch or "
                         "key length")
    if (cos is None) != (sin is None):
        raise ShapeError("multi_head_attention: cos and sin come together")
    for table in (t for t in (cos, sin) if t is not None):
        rules.same_dtype([q, table], "multi_head_attention")
        for x, n in ((q, heads), (k, kv_heads)):
            full = _split_shape(x, n, size)
            shape = rules.broadcast_shapes(table.shape, full)
            if not all(equal(a, b) for a, b in zip(shape, full)):
                raise ShapeError(f"multi_head_attention: rotary table {table} does not "
                                 f"broadcast to the heads {list(full)}")
    if mask is not None:
        rules.broadcast_shapes(mask.shape, (q.shape[0], heads, q.shape[1], k.shape[1]))
    check_window_softcap(attrs, "multi_head_attention")
    return [q.with_shape((q.shape[0], q.shape[1], heads * v_size))]


define("multi_head_attention", "q k v cos? sin? mask?", _rule,
       _reference("multi_head_attention"), "fused",
       "heads split from [b, s, h*d] projections, rotary on q and k when cos/sin are given, "
       "scaled_dot_product_attention (window, softcap as there), heads merged back to [b, s, h*d]",
       num_heads=REQUIRED, kv_num_heads=REQUIRED, scale=None, is_causal=False, window=None,
       softcap=None)


def _split(e: Emitter, x, heads: int, rotary: tuple):
    b, s, width = x.shape
    x = e.op("permute", e.op("reshape", x, shape=[b, s, heads, width // heads]),
             dims=HEADS_FIRST)
    return e.op("rotary_embedding", x, *rotary) if rotary[0] is not None else x


@decomposes("multi_head_attention")
def _multi_head_attention(e: Emitter, inputs, attrs):
    q, k, v, cos, sin, mask = inputs
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    out = e.op("scaled_dot_product_attention", _split(e, q, heads, (cos, sin)),
               _split(e, k, kv_heads, (cos, sin)), _split(e, v, kv_heads, (None,)), mask,
               is_causal=attrs["is_causal"], scale=attrs["scale"],
               enable_gqa=heads != kv_heads, window=attrs["window"], softcap=attrs["softcap"])
    b, _, s, size = out.shape
    merged = e.op("permute", out, dims=HEADS_FIRST)
    return [e.op("reshape", merged, shape=[b, s, heads * size])]
