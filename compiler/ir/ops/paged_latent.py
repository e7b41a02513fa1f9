"""paged_latent_attention: one `latent_attention` block of a generation step, over a paged cache
of compressed latents.

DeepSeek's multi-head latent attention (compiler/ir/ops/latent.py) expands every head's key and
value from a per-token latent c (kv_lora_rank wide, after its norm) and appends one shared
rotary key k_rope (dr wide) to every head. So the cache keeps c and k_rope per token, kv_lora_rank
+ dr values, not the heads * (dn + dr + dv) of expanded keys and values (for DeepSeek-V3, 576
against 40960). This op is `latent_attention(is_causal=true)` in the packed step's setting of
`paged_attention` (compiler/ir/ops/paged.py: batch 1, the token axis packs several sequences,
`seq_slots`, `token_seq`, `token_len` as there):

- `latent_cache` [P, 1, kv_lora_rank] and `rope_cache` [P, 1, dr] hold earlier tokens' latents
  and rotated shared keys (the layer's `k_cache_<i>` and `v_cache_<i>` pools);
- q [1, heads, T, dn + dr] is the assembled query (rotary part rotated), latent [1, 1, T,
  kv_lora_rank] and k_rope [1, 1, T, dr] this step's tokens', weight kv_b_proj's
  [heads * (dn + dv), kv_lora_rank].

Outputs: the attention [1, T, heads * dv], and the step's latents [T, 1, kv_lora_rank] and
rotary keys [T, 1, dr], which the runtime writes into the pools.

The decomposition never expands the cache: it absorbs the up-projection into the query and the
output (DeepSeek's inference form). With W = [W_k; W_v] per head, q_nope . (W_k c) = (W_k^T
q_nope) . c and sum_j p_j W_v c_j = W_v (sum_j p_j c_j), so each head attends over the latents
directly (score = (W_k^T q_nope) . c_j + q_rope . k_rope_j) and the up-projection runs once per
query token, not once per attended key. An int8 cache comes with `latent_scale` and
`rope_scale` [P, 1] as paged_attention's scales. Hidden keys never reach a row; a NaN or Inf in a
visible latent propagates, as in the expanded form.
"""

from __future__ import annotations

import math

from ..symbolic import equal
from .fused import Emitter, _reference, decomposes
from .nn import check_window_softcap
from .paged import _check_cache_dtype, _check_index_inputs, _gather_slots, _visible
from .registry import REQUIRED, ShapeError, define

INPUTS = ("q latent k_rope weight latent_cache rope_cache seq_slots token_seq token_len "
          "latent_scale? rope_scale?")


def _padded(operands) -> list:
    return [*operands, *[None] * (len(INPUTS.split()) - len(operands))]


def _rule(types, attrs):
    q, latent, k_rope, weight, latent_cache, rope_cache, seq_slots, token_seq, token_len, \
        latent_scale, rope_scale = _padded(types)
    heads, nope, v_size = attrs["num_heads"], attrs["nope_head_dim"], attrs["v_head_dim"]
    if q.rank != 4 or latent.rank != 4 or k_rope.rank != 4 or weight.rank != 2:
        raise ShapeError(f"paged_latent_attention: q {q}, latent {latent}, k_rope {k_rope} "
                         "must be 4-d and the weight 2-d")
    tokens, rank, rope = q.shape[2], latent.shape[3], k_rope.shape[3]
    if not (equal(q.shape[0], 1) and equal(q.shape[1], heads) and isinstance(rope, int)
            and equal(q.shape[3], nope + rope)):
        raise ShapeError(f"paged_latent_attention: q {q} is not [1, {heads} heads, tokens, "
                         f"{nope} + rope]")
    for name, t in (("latent", latent), ("k_rope", k_rope)):
        if tuple(t.shape[:2]) != (1, 1) or not equal(t.shape[2], tokens):
            raise ShapeError(f"paged_latent_attention: {name} {t} is not [1, 1, tokens, width]")
    if not (equal(weight.shape[0], heads * (nope + v_size)) and equal(weight.shape[1], rank)):
        raise ShapeError(f"paged_latent_attention: weight {weight} is not "
                         f"[{heads} * ({nope} + {v_size}), {rank}]")
    if latent_cache.rank != 3 or tuple(latent_cache.shape[1:]) != (1, rank) \
            or rope_cache.rank != 3 or tuple(rope_cache.shape[1:]) != (1, rope) \
            or not equal(latent_cache.shape[0], rope_cache.shape[0]):
        raise ShapeError(f"paged_latent_attention: caches {latent_cache} and {rope_cache} must "
                         f"be [slots, 1, {rank}] and [slots, 1, {rope}]")
    _check_cache_dtype(q, latent_cache, rope_cache, latent_scale, rope_scale)
    _check_index_inputs("paged_latent_attention", tokens, seq_slots, token_seq, token_len)
    check_window_softcap({**attrs, "is_causal": True}, "paged_latent_attention")
    return [q.with_shape((1, tokens, heads * v_size)), q.with_shape((tokens, 1, rank)),
            q.with_shape((tokens, 1, rope))]


define("paged_latent_attention", INPUTS, _rule, _reference("paged_latent_attention"), "fused",
       "causal multi-head latent attention of a packed step's tokens over their sequences' "
       "cached and new latents and rotary keys (slot lists into a paged pool), the "
       "up-projection absorbed into query and output; returns the attention and the step's "
       "latents and rotary keys for the pool",
       num_heads=REQUIRED, nope_head_dim=REQUIRED, v_head_dim=REQUIRED, scale=None,
       window=None, softcap=None)


def _heads_first(e: Emitter, x, dims=(1, 0, 2)):
    return e.op("permute", x, dims=list(dims))


@decomposes("paged_latent_attention")
def _paged_latent_attention(e: Emitter, inputs, attrs):
    q, latent, k_rope, weight, latent_cache, rope_cache, seq_slots, token_seq, token_len, \
        latent_scale, rope_scale = _padded(inputs)
    heads, nope, v_size = attrs["num_heads"], attrs["nope_head_dim"], attrs["v_head_dim"]
    _, _, tokens, width = q.shape
    rank, rope = latent.shape[3], k_rope.shape[3]
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(width)
    new_c = e.op("reshape", latent, shape=[tokens, 1, rank])
    new_r = e.op("reshape", k_rope, shape=[tokens, 1, rope])
    slots = e.op("index_select", seq_slots, token_seq, dim=0)              # [T, L]
    length = seq_slots.shape[1]
    hidden = e.op("logical_not", _visible(e, slots, token_len, attrs["window"]))
    cs = e.op("reshape", _gather_slots(e, latent_cache, latent_scale, new_c, slots, hidden),
              shape=[tokens, length, rank])                                # [T, L, r]
    rs = e.op("reshape", _gather_slots(e, rope_cache, rope_scale, new_r, slots, hidden),
              shape=[tokens, length, rope])                                # [T, L, dr]
    w = e.op("reshape", weight, shape=[heads, nope + v_size, rank])
    w_k = e.op("slice", w, dim=1, start=0, end=nope, step=1)               # [h, dn, r]
    w_v = e.op("slice", w, dim=1, start=nope, end=nope + v_size, step=1)   # [h, dv, r]
    query = e.op("reshape", q, shape=[heads, tokens, width])               # [h, T, dn + dr]
    q_nope = e.op("slice", query, dim=2, start=0, end=nope, step=1)
    q_rope = _heads_first(e, e.op("slice", query, dim=2, start=nope, end=width, step=1))
    q_latent = _heads_first(e, e.op("matmul", q_nope, w_k))               # [T, h, r]
    scores = e.op("add", e.op("matmul", q_latent, e.op("permute", cs, dims=[0, 2, 1])),
                  e.op("matmul", q_rope, e.op("permute", rs, dims=[0, 2, 1])))  # [T, h, L]
    scores = e.op("mul", scores, e.const(scale, q.dtype))
    if attrs["softcap"]:
        cap = e.const(attrs["softcap"], q.dtype)
        scores = e.op("mul", e.op("tanh", e.op("div", scores, cap)), cap)
    scores = e.op("where", e.op("reshape", hidden, shape=[tokens, 1, length]),
                  e.const(float("-inf"), q.dtype), scores)
    probs = e.op("softmax", scores, dim=-1)
    attended = _heads_first(e, e.op("matmul", probs, cs))                  # [h, T, r]
    out = _heads_first(e, e.op("matmul", attended, e.op("permute", w_v, dims=[0, 2, 1])))
    return [e.op("reshape", out, shape=[1, tokens, heads * v_size]), new_c, new_r]
