"""Mixture-of-experts blocks: transformers' grouped expert path becomes one `moe` node.

What the pattern finds is the computation, not a model class (transformers 5 exports it for
Mixtral, Qwen2/3-MoE, OLMoE, Granite-MoE and the others that share its expert kernels): the
token-expert pairs sorted by expert, counted per expert (`histc`, cumulated into offsets), two
`grouped_matmul`s with a gated activation between them, each row scaled by its routing weight,
put back in token order by the inverse permutation and summed over the k choices.

The routing weights and indices must come from one `topk` of the router's scores, in a form the
`moe` op's routing attributes express (see moe_routing: softmax or sigmoid scores, a score bias,
group-limited selection, renormalisation, a scale). Anything else is left unfused and runs as the
primitive ops.
"""

from __future__ import annotations

from compiler.ir import DType

from ..rewrite import RuleSet, rule
from ..rewrite.match import same_dim
from .common import activation_name, misfit
from .moe_routing import routing_of
from .moe_shared import SHARED


def _experts(op, x, w_gate_up, w_down, weights, indices):
    flat_ids = op.reshape(indices, _name="flat_ids")
    perm = op.sort(flat_ids, _output=1, _name="perm")
    sorted_ids = op.sort(flat_ids, _output=0)
    # on the CPU transformers counts float ids; elsewhere (a meta-device export of a
    # checkpoint) int32 ids, which the frontend counts as f64 and casts back
    ids = op.any_of(op.cast(sorted_ids, _name="ids_cast"), sorted_ids)
    counts = op.histc(op.cast(ids), _name="counts")
    counted = op.any_of(op.cast(counts, _name="counts_cast"), counts)
    offsets = op.cast(op.cumsum(op.cast(counted)))
    tokens = op.index(x, op.div(perm, op.const(name="k"), rounding_mode="floor"))
    hidden = op.grouped_matmul(tokens, w_gate_up, offsets)
    gate = op.slice(hidden, _name="gate")
    up = op.slice(hidden, _name="up")
    act = op.any_of(*(getattr(op, a)(gate) for a in ("silu", "gelu", "relu")), name="act")
    down = op.grouped_matmul(op.mul(act, up), w_down, offsets)
    scaled = op.mul(down, op.reshape(op.index(op.reshape(weights), perm)))
    inverse = op.index_put(op.full(), op.arange(_name="rows"), perm)
    return op.sum(op.reshape(op.index(scaled, inverse), _name="per_choice"), _name="out")


def _check(ctx, x, w_gate_up, w_down, weights, indices, k, counts, rows, gate, up, act,
           per_choice, out, perm, flat_ids, ids_cast=None, counts_cast=None, **_):
    routing = routing_of(ctx.graph, weights, indices)
    if isinstance(routing, str):
        return routing
    experts, inter = w_gate_up.shape[0], w_down.shape[1]
    if indices.type.rank != 2 or indices.shape[1] != k or weights.type.rank != 2:
        return f"the routing is not [tokens, {k}]"
    if perm.producer.attrs["descending"] or flat_ids.type.rank != 1:
        return "the pairs are not sorted by expert, ascending"
    for cast in (ids_cast, counts_cast):  # integer casts must hold every id and count
        if cast is not None and cast.dtype not in (DType.i32, DType.i64):
            return f"{cast.name} casts ids or counts to {cast.dtype.value}"
    h = counts.producer.attrs
    if (h["bins"], h["min"], h["max"]) != (experts, 0.0, experts - 1):
        return f"histc {h} does not count {experts} experts"
    g, u = gate.producer.attrs, up.producer.attrs
    if (g["dim"] % 2, g["start"], g["step"], u["dim"] % 2, u["step"]) != (1, 0, 1, 1, 1) \
            or not same_dim(g["end"], inter) or not same_dim(u["start"], inter):
        return f"gate and up are not the two halves [0:{inter}] and [{inter}:] of the projection"
    r = rows.producer.attrs
    if r["start"] != 0 or r["step"] != 1 or not same_dim(r["end"], flat_ids.shape[0]):
        return "the inverse permutation is not written from arange(pairs)"
    if per_choice.type.rank != 3 or out.producer.attrs["dims"] not in ([1], [-2]) \
            or out.producer.attrs["keepdim"] or not same_dim(per_choice.shape[1], k):
        return "the expert outputs are not summed over the k choices"
    return misfit("moe", [x, routing.logits, w_gate_up, w_down, None, None, routing.score_bias],
                  top_k=k, activation=activation_name(act), **routing.attrs)


def _rewrite(op, x, w_gate_up, w_down, weights, indices, k, act, **_):
    routing = routing_of(op.graph, weights, indices)
    return op.moe(x, routing.logits, w_gate_up, w_down, None, None, routing.score_bias, top_k=k,
                  activation=activation_name(act), **routing.attrs)


MOE = rule("moe", _experts, _rewrite, check=_check)

RULES = RuleSet([MOE], "moe")
SHARED_RULES = RuleSet(SHARED, "moe_shared")
