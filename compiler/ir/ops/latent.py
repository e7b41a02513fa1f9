"""latent_attention: DeepSeek's multi-head latent attention (MLA), from the compressed latent.

DeepSeek-V2/V3 project each token to a small latent c (kv_lora_rank wide, RMS-normalized) and
one shared rotary key part k_rope; per-head keys and values are expanded from c by one linear
(kv_b_proj), the shared k_rope is appended to every head's key:

    kv = linear(c, W).reshape(b, t, h, dn + dv).transpose(1, 2)
    k = cat(kv[..., :dn], k_rope.expand(b, h, t, dr));  v = kv[..., dn:]
    o = scaled_dot_product_attention(q, k, v, mask).transpose(1, 2).reshape(b, s, h * dv)

The op takes the attention from c and k_rope on, so what a generation cache has to keep per
token is visible in the graph: c and k_rope (kv_lora_rank + dr values), not the h * (dn + dv)
expanded ones. q is the assembled heads-first query [b, h, s, dn + dr] (its rotary part already
rotated, as k_rope is); W is kv_b_proj's weight [h * (dn + dv), kv_lora_rank].

Its meaning is its decomposition (the nodes above), which every backend without an MLA kernel
lowers instead.
"""

from __future__ import annotations

from ..symbolic import equal
from . import shape_rules as rules
from .fused import Emitter, _reference, decomposes
from .multi_head import HEADS_FIRST
from .nn import check_window_softcap
from .registry import REQUIRED, ShapeError, define


def _rule(types, attrs):
    q, latent, k_rope, weight, mask = types
    rules.same_dtype([q, latent, k_rope, weight], "latent_attention")
    heads, nope, v_size = attrs["num_heads"], attrs["nope_head_dim"], attrs["v_head_dim"]
    if q.rank != 4 or latent.rank != 4 or k_rope.rank != 4 or weight.rank != 2:
        raise ShapeError(f"latent_attention: q {q}, latent {latent}, k_rope {k_rope} must be "
                         "4-d and the weight 2-d")
    b, h, s, qk = q.shape
    rope = k_rope.shape[3]
    if not (isinstance(heads, int) and equal(h, heads) and isinstance(qk, int)
            and isinstance(rope, int) and qk == nope + rope):
        raise ShapeError(f"latent_attention: q {q} is not [batch, {heads} heads, seq, "
                         f"{nope} + rope]")
    if latent.shape[1] != 1 or k_rope.shape[1] != 1 or not equal(latent.shape[2], k_rope.shape[2]):
        raise ShapeError(f"latent_attention: latent {latent} and k_rope {k_rope} must be "
                         "[batch, 1, keys, width] of one key length")
    if not (equal(weight.shape[0], heads * (nope + v_size)) and equal(weight.shape[1],
                                                                       latent.shape[3])):
        raise ShapeError(f"latent_attention: weight {weight} is not "
                         f"[{heads} * ({nope} + {v_size}), {latent.shape[3]}]")
    if mask is not None:
        rules.broadcast_shapes(mask.shape, (b, heads, s, latent.shape[2]))
    check_window_softcap(attrs, "latent_attention")
    return [q.with_shape((b, s, heads * v_size))]


define("latent_attention", "q latent k_rope weight mask?", _rule, _reference("latent_attention"),
       "fused", "multi-head latent attention: keys and values expanded from the latent by "
       "weight, the shared k_rope appended to each head's key, scaled_dot_product_attention, "
       "heads merged to [b, s, h*dv]", num_heads=REQUIRED, nope_head_dim=REQUIRED,
       v_head_dim=REQUIRED, scale=None, is_causal=False, window=None, softcap=None)


@decomposes("latent_attention")
def _latent_attention(e: Emitter, inputs, attrs):
    q, latent, k_rope, weight, mask = inputs
    heads, nope, v_size = attrs["num_heads"], attrs["nope_head_dim"], attrs["v_head_dim"]
    b, _, keys, _ = latent.shape
    kv = e.op("linear", latent, weight, None)
    kv = e.op("permute", e.op("reshape", kv, shape=[b, keys, heads, nope + v_size]),
              dims=HEADS_FIRST)
    k_nope = e.op("slice", kv, dim=3, start=0, end=nope, step=1)
    value = e.op("slice", kv, dim=3, start=nope, end=nope + v_size, step=1)
    shared = e.op("expand", k_rope, shape=[b, heads, keys, k_rope.shape[3]])
    key = e.op("concat", k_nope, shared, dim=3)
    out = e.op("scaled_dot_product_attention", q, key, value, mask, is_causal=attrs["is_causal"],
               scale=attrs["scale"], enable_gqa=False, window=attrs["window"],
               softcap=attrs["softcap"])
    _, _, seq, _ = out.shape
    merged = e.op("permute", out, dims=HEADS_FIRST)
    return [e.op("reshape", merged, shape=[b, seq, heads * v_size])]
