"""Head split, rotary, attention and head merge around one attention: `multi_head_attention`.

transformers' attention modules all read the same way:

    q = q_proj(x).view(b, s, h, d).transpose(1, 2)        # reshape + permute [0, 2, 1, 3]
    k, v likewise with the KV head count
    q, k = apply_rotary_pos_emb(q, k, cos, sin)            # rotary_embedding (optional)
    o = scaled_dot_product_attention(q, k, v, mask, ...)
    o = o.transpose(1, 2).reshape(b, s, h * d)            # permute + reshape

The whole block becomes one `multi_head_attention` on the [b, s, h * d] projections, so a backend
with a kernel for it (the onnxruntime backend's CausalAttention / GroupQueryAttention /
MultiHeadAttention) skips the four transposes and the separate rotary ops. Backends without one
get the same nodes back from its decomposition. The split must be exactly `reshape` to
[b, s, h, d] then `permute [0, 2, 1, 3]`, and the merge its inverse (to [b, s, h * d], or to
[b * s, h * d] as GPT-2 writes it); the transposed intermediates may have no other reader (a KV
cache returned as an output keeps the block unfused).
"""

from __future__ import annotations

from ..rewrite import RuleSet, rule
from .common import misfit, shape_is

_HEADS_FIRST = [0, 2, 1, 3]


def _is_heads_first(dims) -> bool:
    return list(dims) == _HEADS_FIRST


def _split(op, x, name: str):
    return op.permute(op.reshape(x, _name=f"{name}_heads"), dims=_is_heads_first,
                      _name=f"{name}_split")


def _merge(op, attended):
    return op.reshape(op.permute(attended, dims=_is_heads_first), _name="merged")


def _attend(op, q, k, v, mask):
    return op.scaled_dot_product_attention(q, k, v, mask, is_causal=op.capture("is_causal"),
                                           scale=op.capture("scale"),
                                           enable_gqa=op.capture("enable_gqa"), _name="attended")


def _rotary_block(op, q, k, v, cos, sin, mask):
    rotated_q = op.rotary_embedding(_split(op, q, "q"), cos, sin)
    rotated_k = op.rotary_embedding(_split(op, k, "k"), cos, sin)
    return _merge(op, _attend(op, rotated_q, rotated_k, _split(op, v, "v"), mask))


def _plain_block(op, q, k, v, mask):
    return _merge(op, _attend(op, _split(op, q, "q"), _split(op, k, "k"), _split(op, v, "v"),
                              mask))


def _heads(x, split) -> int | None:
    """The head count when `split` is [b, s, h, d] of the [b, s, h * d] projection x."""
    if x.type.rank != 3 or split.type.rank != 4:
        return None
    b, s, h, d = split.shape
    if not (isinstance(h, int) and isinstance(d, int)):
        return None
    return h if shape_is(x, [b, s, h * d]) else None


def _check(ctx, q, k, v, q_heads, k_heads, v_heads, attended, merged, mask=None, cos=None,
           sin=None, **b):
    heads, kv_heads = _heads(q, q_heads), _heads(k, k_heads)
    if heads is None or kv_heads is None or _heads(v, v_heads) != kv_heads:
        return "q, k and v are not split from [batch, seq, heads * head_size] projections"
    batch, _, seq, size = attended.shape
    if not (shape_is(merged, [batch, seq, heads * size])
            or shape_is(merged, [batch * seq, heads * size])):
        return "the heads are not merged back to [batch, seq, heads * head_size]"
    return misfit("multi_head_attention", [q, k, v, cos, sin, mask], num_heads=heads,
                  kv_num_heads=kv_heads, scale=b["scale"], is_causal=b["is_causal"])


def _rewrite(op, q, k, v, q_heads, k_heads, merged, scale, is_causal, mask=None, cos=None,
             sin=None, **_):
    out = op.multi_head_attention(q, k, v, cos, sin, mask, num_heads=q_heads.shape[2],
                                  kv_num_heads=k_heads.shape[2], scale=scale,
                                  is_causal=is_causal)
    if merged.type.rank == 2:  # GPT-2's Conv1D merges straight to [batch * seq, hidden]
        out = op.reshape(out, shape=list(merged.shape))
    return out


ROTARY_BLOCK = rule("multi_head_attention_rotary", _rotary_block, _rewrite, check=_check)
PLAIN_BLOCK = rule("multi_head_attention", _plain_block, _rewrite, check=_check)

RULES = RuleSet([ROTARY_BLOCK, PLAIN_BLOCK], "heads")
