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
cache returned as an output keeps the block unfused). The attention's window and softcap carry
over. Qwen3 RMS-normalizes each head of q and k
between the split and the rotary (q_norm, k_norm); that block fuses too, the norms kept on the
projections split and merged again.
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


def _normed_split(op, x, w, name: str):
    """Qwen3's split: each head RMS-normalized (q_norm / k_norm over head_size) before the
    transpose."""
    heads = op.reshape(x, _name=f"{name}_heads")
    normed = op.rms_norm(heads, w, normalized_shape=op.capture(f"{name}_norm_shape"),
                         eps=op.capture(f"{name}_eps"), _name=f"{name}_normed")
    return op.permute(normed, dims=_is_heads_first, _name=f"{name}_split")


def _merge(op, attended):
    return op.reshape(op.permute(attended, dims=_is_heads_first), _name="merged")


def _attend(op, q, k, v, mask):
    return op.scaled_dot_product_attention(q, k, v, mask, is_causal=op.capture("is_causal"),
                                           scale=op.capture("scale"),
                                           enable_gqa=op.capture("enable_gqa"),
                                           window=op.capture("window"),
                                           softcap=op.capture("softcap"), _name="attended")


def _rotary_block(op, q, k, v, cos, sin, mask):
    rotated_q = op.rotary_embedding(_split(op, q, "q"), cos, sin)
    rotated_k = op.rotary_embedding(_split(op, k, "k"), cos, sin)
    return _merge(op, _attend(op, rotated_q, rotated_k, _split(op, v, "v"), mask))


def _normed_rotary_block(op, q, k, v, cos, sin, mask, q_w, k_w):
    rotated_q = op.rotary_embedding(_normed_split(op, q, q_w, "q"), cos, sin)
    rotated_k = op.rotary_embedding(_normed_split(op, k, k_w, "k"), cos, sin)
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
                  kv_num_heads=kv_heads, scale=b["scale"], is_causal=b["is_causal"],
                  window=b["window"], softcap=b["softcap"])


def _rewrite(op, q, k, v, q_heads, k_heads, merged, scale, is_causal, window, softcap,
             mask=None, cos=None, sin=None, **_):
    out = op.multi_head_attention(q, k, v, cos, sin, mask, num_heads=q_heads.shape[2],
                                  kv_num_heads=k_heads.shape[2], scale=scale,
                                  is_causal=is_causal, window=window, softcap=softcap)
    if merged.type.rank == 2:  # GPT-2's Conv1D merges straight to [batch * seq, hidden]
        out = op.reshape(out, shape=list(merged.shape))
    return out


def _check_normed(ctx, q_heads, k_heads, q_normed, q_w, k_w, q_norm_shape, k_norm_shape, **b):
    size = q_heads.shape[-1]
    if list(q_norm_shape) != [size] or list(k_norm_shape) != [k_heads.shape[-1]]:
        return "the per-head norms do not normalize over head_size alone"
    for w, heads in ((q_w, q_heads), (k_w, k_heads)):
        if w is None or not shape_is(w, [heads.shape[-1]]) or w.dtype != q_normed.dtype:
            return f"%{getattr(w, 'name', '_')} is not a per-head norm weight"
    return _check(ctx, q_heads=q_heads, k_heads=k_heads, **b)


def _rewrite_normed(op, q, k, q_heads, k_heads, q_w, k_w, q_norm_shape, k_norm_shape, q_eps,
                    k_eps, **b):
    """The norms stay, on the projections split and merged again ([b, s, h * d] in and out:
    two free reshapes), so the block fuses and a backend kernel gets normalized q and k."""
    def normed(x, heads, w, shape, eps):
        split = op.reshape(x, shape=list(heads.shape))
        return op.reshape(op.rms_norm(split, w, normalized_shape=list(shape), eps=eps),
                          shape=list(x.shape))
    return _rewrite(op, normed(q, q_heads, q_w, q_norm_shape, q_eps),
                    normed(k, k_heads, k_w, k_norm_shape, k_eps), q_heads=q_heads,
                    k_heads=k_heads, **b)


NORMED_ROTARY_BLOCK = rule("multi_head_attention_normed_rotary", _normed_rotary_block,
                           _rewrite_normed, check=_check_normed)
ROTARY_BLOCK = rule("multi_head_attention_rotary", _rotary_block, _rewrite, check=_check)
PLAIN_BLOCK = rule("multi_head_attention", _plain_block, _rewrite, check=_check)

RULES = RuleSet([NORMED_ROTARY_BLOCK, ROTARY_BLOCK, PLAIN_BLOCK], "heads")
