"""Attention: the explicit softmax(QK^T * scale + mask) V form, repeat_kv, and causal masks.

- `attention`: `matmul(softmax(matmul(q, k^T) * scale + mask), v)` (transformers'
  eager_attention_forward; the scale may be a multiply, a divide or absent, the mask an additive
  float mask, a bool mask applied with `where(mask, s, -inf)`, or absent; a softmax computed in
  float32 between casts is accepted) becomes `scaled_dot_product_attention`. Gemma 2's logit
  softcapping between the scale and the mask, `tanh(scores / c) * c`, becomes `softcap=c`.
- `attention_gqa`: k and v expanded to the query heads by repeat_kv (`reshape` to insert a
  head-group axis, `expand`, `reshape` back) feed attention with `enable_gqa=true` on the
  unrepeated k and v, so no repeated copy is ever made.
- `attention_causal`: a mask that is the causal mask (`triu(full(-inf), 1)` or
  `tril(full(true))`, broadcast over batch and heads, or a constant holding one) becomes
  `is_causal=true`, so the mask is never materialized.
"""

from __future__ import annotations

import math

from compiler.ir import DType

from ..rewrite import RuleSet, rule
from .common import last_axis, misfit, same_shape


def _swaps_last_two(dims) -> bool:
    n = len(dims)
    return n >= 2 and [d % n for d in dims] == list(range(n - 2)) + [n - 1, n - 2]


def _explicit(op, q, k, v, mask):
    scores = op.matmul(q, op.permute(k, dims=_swaps_last_two), _name="scores")
    scaled = op.any_of(op.mul(scores, op.const(name="scale")),
                       op.div(scores, op.const(name="divisor")), scores)
    capped = op.any_of(op.mul(op.tanh(op.div(scaled, op.const(name="cap_in"))),
                              op.const(name="cap_out"), _name="capped"), scaled)
    masked = op.any_of(op.add(capped, mask),
                       op.where(mask, capped, op.const(float("-inf"))), capped)
    probs = op.softmax(op.optional("cast", masked), dim=op.capture("dim"))
    return op.matmul(op.optional("cast", probs), v)


def _check_explicit(ctx, q, k, v, dim, scores, mask=None, **_):
    if not last_axis(dim, scores.type.rank):
        return f"softmax over dim {dim}, not the key axis"
    if q.type.rank < 2 or not (q.dtype == k.dtype == v.dtype):
        return "q, k and v need one dtype and rank >= 2"
    if q.type.rank != k.type.rank or k.type.rank != v.type.rank:
        return "q, k and v have different ranks (broadcast batch dims)"
    scale = _scale(ctx.match.bindings)
    if scale is None or not math.isfinite(scale):
        return "the scale is not a finite constant"
    softcap = _softcap(ctx.match.bindings)
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0):
        return "the softcap's divisor and factor are not one positive constant"
    why = misfit("scaled_dot_product_attention", [q, k, v, mask], scale=scale, softcap=softcap)
    out = ctx.match.anchor.outputs[0]
    if why is None and not same_shape(out, _Dims(out, q.shape[:-1] + (v.shape[-1],))):
        return "the mask broadcasts the scores to more batch dims than q has"
    return why


def _scale(bindings) -> float | None:
    if "scale" in bindings:
        return float(bindings["scale"])
    if "divisor" in bindings:
        return 1.0 / bindings["divisor"] if bindings["divisor"] else None
    return 1.0


def _softcap(bindings) -> float | None:
    """c of `tanh(scores / c) * c`; NaN when the divisor and the factor differ."""
    if "cap_in" not in bindings:
        return None
    cap_in, cap_out = float(bindings["cap_in"]), float(bindings["cap_out"])
    return cap_in if cap_in == cap_out else math.nan


def _explicit_rewrite(op, q, k, v, mask=None, **bindings):
    return op.scaled_dot_product_attention(q, k, v, mask, scale=_scale(bindings),
                                           softcap=_softcap(bindings))


# -- repeat_kv -----------------------------------------------------------------------------------
def _repeat_kv(op, x, name: str):
    unsqueezed = op.reshape(x, _name=f"{name}_unsqueezed")
    return op.reshape(op.expand(unsqueezed, _name=f"{name}_expanded"), _name=f"{name}_repeated")


def _gqa(op, q, k, v, mask):
    return op.scaled_dot_product_attention(q, _repeat_kv(op, k, "k"), _repeat_kv(op, v, "v"), mask,
                                           is_causal=op.capture("is_causal"),
                                           scale=op.capture("scale"), enable_gqa=False,
                                           window=op.capture("window"),
                                           softcap=op.capture("softcap"))


def _groups(x, unsqueezed, expanded, repeated) -> int | None:
    """n_rep when the chain is transformers' repeat_kv of a [b, h, s, d] x, else None."""
    if x.type.rank != 4:
        return None
    b, h, s, d = x.shape
    if not same_shape(unsqueezed, _Dims(x, [b, h, 1, s, d])):
        return None
    n = expanded.shape[2]
    if not same_shape(expanded, _Dims(x, [b, h, n, s, d])):
        return None
    if not isinstance(n, int) or not same_shape(repeated, _Dims(x, [b, h * n, s, d])):
        return None
    return n


class _Dims:
    """Something with a shape, to compare a value's shape with a list of dims."""

    def __init__(self, like, shape):
        self.shape = tuple(shape)
        self.type = like.type.with_shape(shape)


def _check_gqa(ctx, q, k, v, **b):
    nk = _groups(k, b["k_unsqueezed"], b["k_expanded"], b["k_repeated"])
    nv = _groups(v, b["v_unsqueezed"], b["v_expanded"], b["v_repeated"])
    if nk is None or nv is None:
        return "k or v is not repeat_kv of a [batch, heads, seq, head_dim] tensor"
    if nk != nv:
        return f"k is repeated {nk} times but v {nv} times"
    return None


def _gqa_rewrite(op, q, k, v, is_causal, scale, window, softcap, mask=None, **_):
    return op.scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, scale=scale,
                                           enable_gqa=True, window=window, softcap=softcap)


# -- causal masks --------------------------------------------------------------------------------
def _broadcast(op, inner):
    """`inner`, maybe reshaped and/or expanded (unsqueezed to [1, 1, L, S], then broadcast)."""
    return op.any_of(inner, op.reshape(inner), op.expand(inner), op.expand(op.reshape(inner)),
                     op.reshape(op.expand(inner)))


def _causal(op, q, k, v):
    float_mask = op.triu(op.full(value=op.capture("fill"), _name="fill_node"), diagonal=1,
                         _name="tri")
    bool_mask = op.tril(op.full(value=True, _name="fill_node"), diagonal=0, _name="tri")
    mask = op.any_of(_broadcast(op, float_mask), _broadcast(op, bool_mask))
    return op.scaled_dot_product_attention(q, k, v, mask, is_causal=False,
                                           scale=op.capture("scale"),
                                           enable_gqa=op.capture("enable_gqa"),
                                           softcap=op.capture("softcap"))


def _check_causal(ctx, q, k, tri, **b):
    fill = b.get("fill")
    if fill is not None and not fill <= -1e30:
        return f"the masked value {fill} is not -inf (or the dtype's lowest)"
    if tri.type.rank != 2:
        return "the triangular mask is not a 2-d [query, key] matrix"
    return _causal_shape(q, k, tri)


def _causal_shape(q, k, tri) -> str | None:
    lq, lk = q.shape[-2], k.shape[-2]
    if not same_shape(tri, _Dims(tri, [lq, lk])):
        return f"the mask {list(tri.shape)} is not [query length, key length]"
    if not same_shape(_Dims(q, [lq]), _Dims(q, [lk])):
        return "query and key lengths differ (a cache offset needs an explicit mask)"
    return None


def _causal_rewrite(op, q, k, v, scale, enable_gqa, softcap, **_):
    return op.scaled_dot_product_attention(q, k, v, None, is_causal=True, scale=scale,
                                           enable_gqa=enable_gqa, softcap=softcap)


def _constant_causal(op, q, k, v, mask):
    return op.scaled_dot_product_attention(q, k, v, mask, is_causal=False,
                                           scale=op.capture("scale"),
                                           enable_gqa=op.capture("enable_gqa"),
                                           softcap=op.capture("softcap"))


def _check_constant_causal(ctx, q, k, mask, **_):
    data = ctx.graph.weight_data.get(mask.name) if mask is not None and \
        ctx.graph.is_weight(mask) else None
    if data is None:
        return "the mask is not a constant with known data"
    return _causal_shape(q, k, _Dims(mask, mask.shape[-2:])) or _is_causal_data(data, mask.dtype)


def _is_causal_data(data, dtype: DType) -> str | None:
    import torch

    t = torch.as_tensor(data)
    flat = t.reshape(-1, t.shape[-2], t.shape[-1])
    lq, lk = flat.shape[-2:]
    upper = torch.ones(lq, lk, dtype=torch.bool).triu(1)
    if dtype == DType.bool:
        ok = bool((flat == ~upper).all())
    else:
        ok = bool((flat[:, ~upper] == 0).all() and (flat[:, upper] <= -1e30).all())
    return None if ok else "the constant mask is not the causal mask"


ATTENTION = rule("attention", _explicit, _explicit_rewrite, check=_check_explicit)
ATTENTION_GQA = rule("attention_gqa", _gqa, _gqa_rewrite, check=_check_gqa)
ATTENTION_CAUSAL = rule("attention_causal", _causal, _causal_rewrite, check=_check_causal)
ATTENTION_CAUSAL_CONSTANT = rule("attention_causal_constant", _constant_causal, _causal_rewrite,
                                 check=_check_constant_causal)

RULES = RuleSet([ATTENTION, ATTENTION_GQA, ATTENTION_CAUSAL, ATTENTION_CAUSAL_CONSTANT],
                "attention")
