"""paged_attention: one causal attention block of a generation step, over a paged KV cache.

A generation step runs a packed batch of tokens: the prompt chunks of some sequences and the next
token of others, `T` tokens in all, on a graph whose batch is 1 and whose sequence axis is the
token axis (vLLM's layout). Every other op of a decoder treats tokens independently, so only
attention needs to know which tokens belong together. This op is `multi_head_attention` (same
[1, T, heads * head_size] projections, same rotary tables, one row per token) in that setting:

- the keys and values of earlier steps live in the cache pool, `k_cache` [P, kv_heads,
  head_size] and `v_cache` (the runtime's pool of blocks viewed as P token slots);
- `seq_slots` [N, L] lists, for each of the step's N sequences, where its keys 0, 1, ... live:
  `s >= 0` is pool slot s; `s <= -2` is this step's token -2 - s (its key is computed here and
  has not reached the pool yet); -1 pads the row;
- token t belongs to sequence `token_seq[t]` and sees that sequence's first `token_len[t]` keys
  (its position + 1: causal), or with `window` only the last `window` of them (sliding window).

Outputs: the attention [1, T, heads * v_size], and the rotated keys [T, kv_heads, head_size] and
values [T, kv_heads, v_size] of the step's tokens, which the runtime writes into the pool. The
paging itself (block tables, slot numbers) stays in the runtime: the op sees slot lists only, so
its kernels need no block size and a decomposition in plain gathers expresses it.

An int8 cache (`precision.kv_cache_dtype: int8`) comes with `k_scale` and `v_scale` [P,
kv_heads]: slot s of head h holds `cache[s, h] * scale[s, h]` (one scale per token and head,
max |x| / 127, as the runtime quantizes what it writes). This step's own keys are exact.

A hidden key never reaches a row (its score is -inf and its value is zeroed), as with
`multi_head_attention(is_causal=true)`; a NaN or Inf in a visible key or value propagates.
"""

from __future__ import annotations

import math

from ..dtypes import DType
from ..symbolic import equal
from . import shape_rules as rules
from .fused import Emitter, _reference, decomposes
from .multi_head import HEADS_FIRST, _check_heads, _head_size, _split
from .registry import REQUIRED, ShapeError, define

INPUTS = "q k v cos? sin? k_cache v_cache seq_slots token_seq token_len k_scale? v_scale?"
_NEW_TOKEN = -2  # slot -2 - t is token t of this step


def _padded(operands) -> list:
    """The operands with the absent trailing optional ones (the int8 scales) as None."""
    return [*operands, *[None] * (len(INPUTS.split()) - len(operands))]


def _rule(types, attrs):
    q, k, v, cos, sin, k_cache, v_cache, seq_slots, token_seq, token_len, k_scale, v_scale = \
        _padded(types)
    heads, kv_heads = _check_heads(attrs)
    size, v_size = _head_size(q, heads, "query"), _head_size(v, kv_heads, "value")
    if q.rank != 3 or not equal(q.shape[0], 1):
        raise ShapeError(f"paged_attention: q {q} must be [1, tokens, heads * head_size]")
    if _head_size(k, kv_heads, "key") != size or not (equal(k.shape[1], q.shape[1])
                                                      and equal(v.shape[1], q.shape[1])):
        raise ShapeError(f"paged_attention: q {q}, k {k}, v {v} disagree on tokens or head size")
    if (cos is None) != (sin is None):
        raise ShapeError("paged_attention: cos and sin come together")
    rules.same_dtype([x for x in (q, k, v, cos, sin) if x is not None], "paged_attention")
    for table in (t for t in (cos, sin) if t is not None):
        for n in (heads, kv_heads):
            full = (1, n, q.shape[1], size)
            shape = rules.broadcast_shapes(table.shape, full)
            if len(shape) != 4 or not all(equal(a, b) for a, b in zip(shape, full)):
                raise ShapeError(f"paged_attention: rotary table {table} does not broadcast to "
                                 f"the heads {list(full)}")
    if k_cache.rank != 3 or tuple(k_cache.shape[1:]) != (kv_heads, size) or v_cache.rank != 3 \
            or tuple(v_cache.shape[1:]) != (kv_heads, v_size) \
            or not equal(k_cache.shape[0], v_cache.shape[0]):
        raise ShapeError(f"paged_attention: caches {k_cache} and {v_cache} must be [slots, "
                         f"{kv_heads}, {size}] and [slots, {kv_heads}, {v_size}]")
    _check_cache_dtype(q, k_cache, v_cache, k_scale, v_scale)
    _check_index_inputs("paged_attention", q.shape[1], seq_slots, token_seq, token_len)
    window = attrs["window"]
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ShapeError(f"paged_attention: window {window!r} must be a positive integer")
    tokens = q.shape[1]
    return [q.with_shape((1, tokens, heads * v_size)),
            q.with_shape((tokens, kv_heads, size)), q.with_shape((tokens, kv_heads, v_size))]


def _check_index_inputs(op: str, tokens, seq_slots, token_seq, token_len) -> None:
    """The block-table inputs every paged op reads: i64, of their ranks, one entry per token."""
    for name, t, rank in (("seq_slots", seq_slots, 2), ("token_seq", token_seq, 1),
                          ("token_len", token_len, 1)):
        if t.dtype != DType.i64 or t.rank != rank:
            raise ShapeError(f"{op}: {name} {t} must be i64 of rank {rank}")
    if not (equal(token_seq.shape[0], tokens) and equal(token_len.shape[0], tokens)):
        raise ShapeError(f"{op}: token_seq and token_len need one entry per token")


def _check_cache_dtype(q, k_cache, v_cache, k_scale, v_scale) -> None:
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (q.dtype, DType.i8):
        raise ShapeError(f"paged_attention: caches must both be {q.dtype} like q, or int8")
    scaled = k_cache.dtype == DType.i8
    if scaled != (k_scale is not None) or scaled != (v_scale is not None):
        raise ShapeError("paged_attention: an int8 cache takes k_scale and v_scale, a float "
                         "one neither")
    if scaled and any(t.dtype != DType.f32 or tuple(t.shape) != tuple(k_cache.shape[:2])
                      for t in (k_scale, v_scale)):
        raise ShapeError(f"paged_attention: scales must be f32 {list(k_cache.shape[:2])}")


define("paged_attention", INPUTS, _rule, _reference("paged_attention"), "fused",
       "causal attention of a packed step's tokens over their sequences' cached and new keys "
       "(slot lists into a paged pool), rotary on q and k; returns the attention and the "
       "step's rotated keys and values for the pool",
       num_heads=REQUIRED, kv_num_heads=REQUIRED, scale=None, window=None, softcap=None)


def _tokens_first(e: Emitter, heads_first):
    """[1, h, T, d] -> [T, h, d]."""
    _, h, t, d = heads_first.shape
    return e.op("permute", e.op("reshape", heads_first, shape=[h, t, d]), dims=[1, 0, 2])


def _gather_slots(e: Emitter, cache, scale, new, slots, hidden):
    """[T, L, h, d]: each slot's row from the pool (dequantized with `scale` when int8) or from
    this step's tokens; hidden slots read row 0 and are zeroed, so that whatever lies there
    never reaches a row."""
    tokens, length = slots.shape
    flat = e.op("reshape", slots, shape=[tokens * length])
    zero = e.const(0, DType.i64)
    from_new = e.op("le", flat, e.const(_NEW_TOKEN, DType.i64))
    in_pool = e.op("ge", flat, zero)
    new_rows = e.op("index_select", new, e.op(
        "where", from_new, e.op("sub", e.const(_NEW_TOKEN, DType.i64), flat), zero), dim=0)
    pool_index = e.op("where", in_pool, flat, zero)
    pool_rows = e.op("index_select", cache, pool_index, dim=0)
    if scale is not None:
        scales = e.op("index_select", scale, pool_index, dim=0)
        pool_rows = e.op("mul", e.op("cast", pool_rows, dtype=new.dtype),
                         e.op("reshape", scales, shape=[tokens * length, cache.shape[1], 1]))
    rows = e.op("where", e.op("reshape", from_new, shape=[tokens * length, 1, 1]), new_rows,
                pool_rows)
    rows = e.op("where", e.op("reshape", hidden, shape=[tokens * length, 1, 1]),
                e.const(0.0, new.dtype), rows)
    return e.op("reshape", rows, shape=[tokens, length, *cache.shape[1:]])


def _visible(e: Emitter, slots, token_len, window):
    """[T, L] bool: key j of token t's sequence is visible to t."""
    length = slots.shape[1]
    j = e.op("reshape", e.op("arange", start=0, end=length, step=1, dtype=DType.i64),
             shape=[1, length])
    last = e.op("reshape", token_len, shape=[token_len.shape[0], 1])
    seen = e.op("logical_and", e.op("lt", j, last),
                e.op("ne", slots, e.const(-1, DType.i64)))
    if window is None:
        return seen
    first = e.op("sub", last, e.const(window, DType.i64))
    return e.op("logical_and", seen, e.op("ge", j, first))


@decomposes("paged_attention")
def _paged_attention(e: Emitter, inputs, attrs):
    q, k, v, cos, sin, k_cache, v_cache, seq_slots, token_seq, token_len, k_scale, v_scale = \
        _padded(inputs)
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    size = q.shape[-1] // heads
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(size)
    tokens = q.shape[1]
    new_k = _tokens_first(e, _split(e, k, kv_heads, (cos, sin)))
    new_v = e.op("reshape", v, shape=[tokens, kv_heads, v.shape[-1] // kv_heads])
    slots = e.op("index_select", seq_slots, token_seq, dim=0)
    visible = _visible(e, slots, token_len, attrs["window"])
    hidden = e.op("logical_not", visible)
    keys = _gather_slots(e, k_cache, k_scale, new_k, slots, hidden)      # [T, L, kv, d]
    values = _gather_slots(e, v_cache, v_scale, new_v, slots, hidden)    # [T, L, kv, dv]
    group = heads // kv_heads
    query = e.op("reshape", _tokens_first(e, _split(e, q, heads, (cos, sin))),
                 shape=[tokens, kv_heads, group, size])
    scores = e.op("matmul", query, e.op("permute", keys, dims=[0, 2, 3, 1]))  # [T, kv, g, L]
    scores = e.op("mul", scores, e.const(scale, q.dtype))
    if attrs["softcap"]:
        cap = e.const(attrs["softcap"], q.dtype)
        scores = e.op("mul", e.op("tanh", e.op("div", scores, cap)), cap)
    length = seq_slots.shape[1]
    scores = e.op("where", e.op("reshape", hidden, shape=[tokens, 1, 1, length]),
                  e.const(float("-inf"), q.dtype), scores)
    probs = e.op("softmax", scores, dim=-1)
    out = e.op("matmul", probs, e.op("permute", values, dims=HEADS_FIRST))  # [T, kv, g, dv]
    out = e.op("reshape", out, shape=[1, tokens, heads * values.shape[-1]])
    return [out, new_k, new_v]
