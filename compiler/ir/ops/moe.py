"""The mixture-of-experts block as one op: routing, the routed experts, their weighted sum.

`moe(x, logits, w_gate_up, w_down, ...)` is what a sparse MoE layer computes from its hidden
states x [tokens, hidden] and its router's logits [tokens, experts]:

- routing picks `top_k` experts per token and their weights. `routing` says how:
  `softmax_topk` (softmax over all experts, then the k largest: Mixtral, Qwen-MoE, OLMoE),
  `topk_softmax` (the k largest logits, then a softmax over them: GPT-OSS, Granite-MoE) or
  `sigmoid_topk` (sigmoid scores: DeepSeek-V3). A `score_bias` [experts] is added to the scores
  for the choice only (DeepSeek's bias correction); the weights are the unbiased scores.
  `normalize` divides the k weights by their sum (plus `normalize_eps`), `scale` multiplies them.
- group-limited routing (DeepSeek-V2's `group_limited_greedy`, DeepSeek-V3, GLM-4-MoE): with
  `n_group` > 1 the experts form n_group equal groups; a group's score is the sum of its
  `group_top` largest choice scores (1: its best, V2; 2: V3); the `topk_group` best groups stay
  and every other expert's choice score becomes `group_fill` (-inf in V3, 0 in V2) before the
  top-k. The weights are then the chosen (group-filled) scores, or with a `score_bias` the
  unbiased, unfilled scores gathered at the chosen experts, as each model computes them.
- each routed expert e is a gated MLP with stacked weights: w_gate_up [experts, hidden, 2 *
  inter] (gate columns first, then up; the in_out layout transformers' grouped path uses),
  w_down [experts, inter, hidden], optional biases [experts, 2 * inter] and [experts, hidden]:
  expert_e(x) = (activation(x @ gate_e) * (x @ up_e)) @ down_e.
- out[t] = sum over the chosen e of weight[t, e] * expert_e(x[t]), plus the shared expert when
  there is one (Qwen2-MoE, DeepSeek-V2/V3, GLM-4-MoE): a dense gated MLP every token runs, in
  linear layout like `gated_mlp` (shared_w_gate, shared_w_up [shared_inter, hidden],
  shared_w_down [hidden, shared_inter]) with the routed experts' activation, scaled by
  sigmoid(x @ shared_gate^T) when a `shared_gate` [1, hidden] is given (Qwen2-MoE).

The decomposition below is the op's meaning (the reference backend runs it): every expert on
every token, the unchosen ones masked out with `where` (so an unchosen expert's inf or NaN never
reaches the sum, as in eager, which never computes it). A backend's kernel computes only the
chosen experts: onnxruntime lowers it to com.microsoft.MoE. The summation order over the k experts
differs from eager's, within the fp32 reordering bound.
"""

from __future__ import annotations

from collections.abc import Callable

from ..dtypes import DType
from ..graph import Value
from ..symbolic import equal
from ..types import TensorType
from .fused import ACTIVATIONS, Emitter, _reference, decomposes
from .registry import REQUIRED, ShapeError, define

ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_topk")
INPUTS = ("x logits w_gate_up w_down b_gate_up? b_down? score_bias? shared_w_gate? shared_w_up? "
          "shared_w_down? shared_gate?")
ARITY = len(INPUTS.split())


def padded(items: list) -> list:
    """The op's inputs with its trailing optional ones filled in as None (a node may omit them)."""
    return [*items, *[None] * (ARITY - len(items))]


def _fits(t: TensorType | None, dims) -> bool:
    return t is not None and t.rank == len(dims) and all(equal(a, b) for a, b in zip(t.shape, dims))


def _group_rule(experts: int, attrs) -> None:
    n, kept, top = attrs["n_group"], attrs["topk_group"], attrs["group_top"]
    if n == 1:
        return
    if attrs["routing"] == "topk_softmax":
        raise ShapeError("moe: group-limited routing (n_group > 1) needs softmax or sigmoid scores")
    if not (isinstance(n, int) and n > 1 and experts % n == 0):
        raise ShapeError(f"moe: n_group {n} must divide the {experts} experts")
    size = experts // n
    if not 0 < kept <= n or not 0 < top <= size:
        raise ShapeError(f"moe: topk_group {kept} must be in 1..{n} and group_top {top} in "
                         f"1..{size} (the experts per group)")
    if attrs["top_k"] > kept * size:
        raise ShapeError(f"moe: top_k {attrs['top_k']} exceeds the {kept * size} experts of the "
                         f"{kept} groups kept")


def _shared_rule(x: TensorType, shared: list, hidden) -> None:
    w_gate, w_up, w_down, gate = shared
    if w_gate is None and w_up is None and w_down is None and gate is None:
        return
    if w_gate is None or w_up is None or w_down is None:
        raise ShapeError("moe: a shared expert needs shared_w_gate, shared_w_up and shared_w_down")
    inter = w_gate.shape[0] if w_gate.rank == 2 else None
    wanted = [(w_gate, (inter, hidden)), (w_up, (inter, hidden)), (w_down, (hidden, inter))]
    wanted += [(gate, (1, hidden))] if gate is not None else []
    for t, dims in wanted:
        if inter is None or not _fits(t, dims) or t.dtype != x.dtype:
            raise ShapeError(f"moe: shared expert weight {t} should be {x.dtype}{list(dims)} "
                             f"(linear layout) for x {x}")


def _moe_rule(types, attrs):
    types = padded(list(types))
    x, logits, w_gate_up, w_down, b_gate_up, b_down, score_bias = types[:7]
    if attrs["routing"] not in ROUTINGS:
        raise ShapeError(f"moe routing is one of {list(ROUTINGS)}, got {attrs['routing']!r}")
    if attrs["activation"] not in ACTIVATIONS:
        raise ShapeError(f"unknown activation '{attrs['activation']}'; use one of "
                         f"{sorted(ACTIVATIONS)}")
    if x.rank != 2 or logits.rank != 2 or w_gate_up.rank != 3 or w_down.rank != 3:
        raise ShapeError(f"moe takes x [tokens, hidden], logits [tokens, experts] and 3-d expert "
                         f"weights; got {x}, {logits}, {w_gate_up}, {w_down}")
    tokens, hidden = x.shape
    experts, inter = logits.shape[1], w_down.shape[1]
    if not isinstance(experts, int) or not 0 < attrs["top_k"] <= experts:
        raise ShapeError(f"moe: top_k {attrs['top_k']} must be in 1..{experts} experts")
    wanted = [(logits, (tokens, experts)), (w_gate_up, (experts, hidden, 2 * inter)),
              (w_down, (experts, inter, hidden))]
    wanted += [(t, dims) for t, dims in ((b_gate_up, (experts, 2 * inter)),
                                         (b_down, (experts, hidden)),
                                         (score_bias, (experts,))) if t is not None]
    for t, dims in wanted:
        if not _fits(t, dims) or t.dtype != x.dtype:
            raise ShapeError(f"moe: operand {t} should be {x.dtype}{list(dims)} for x {x} with "
                             f"{experts} experts of inner size {inter}")
    _group_rule(experts, attrs)
    _shared_rule(x, types[7:], hidden)
    return [x]


define("moe", INPUTS, _moe_rule, _reference("moe"), "fused",
       "mixture of experts: route each token to top_k experts by its logits (optionally within "
       "its best expert groups), sum their gated MLPs weighted by the routing weights, plus an "
       "optionally gated shared expert", top_k=REQUIRED, routing="softmax_topk",
       normalize=False, normalize_eps=0.0, scale=1.0, activation="silu", n_group=1,
       topk_group=1, group_top=1, group_fill=float("-inf"))


def _group_limited(e: Emitter, choice, attrs):
    """Where the experts outside each token's `topk_group` best groups are (bool [tokens, E])."""
    tokens, experts = choice.shape
    n, kept = attrs["n_group"], attrs["topk_group"]
    grouped = e.op("reshape", choice, shape=[tokens, n, experts // n])
    best = e.ops("topk", grouped, k=attrs["group_top"], dim=-1, largest=True, sorted=True)[0]
    group_scores = e.op("sum", best, dims=[-1], keepdim=False)
    kept_ids = e.ops("topk", group_scores, k=kept, dim=-1, largest=True, sorted=True)[1]
    kept_mask = e.op("any", e.op("eq", e.op("reshape", kept_ids, shape=[tokens, kept, 1]),
                                 e.op("arange", start=0, end=n, step=1, dtype=DType.i64)),
                     dims=[1], keepdim=False)
    spread = e.op("expand", e.op("reshape", kept_mask, shape=[tokens, n, 1]),
                  shape=[tokens, n, experts // n])
    return e.op("logical_not", e.op("reshape", spread, shape=[tokens, experts]))


def route(e: Emitter, logits, score_bias, attrs):
    """(weights [tokens, k], expert indices [tokens, k]) as the routing attributes say."""
    k, routing = attrs["top_k"], attrs["routing"]
    if routing == "topk_softmax":
        scores = logits
    else:
        scores = e.op("softmax" if routing == "softmax_topk" else "sigmoid", logits,
                      **({"dim": -1} if routing == "softmax_topk" else {}))
    choice = scores if score_bias is None else e.op("add", scores, score_bias)
    if attrs.get("n_group", 1) > 1:
        dropped = _group_limited(e, choice, attrs)
        choice = e.op("where", dropped, e.const(attrs["group_fill"], choice.dtype), choice)
    values, indices = e.ops("topk", choice, k=k, dim=-1, largest=True, sorted=True)
    weights = values if score_bias is None else e.op("gather", scores, indices, dim=-1)
    if routing == "topk_softmax":
        weights = e.op("softmax", weights, dim=-1)
    if attrs["normalize"]:
        total = e.op("sum", weights, dims=[-1], keepdim=True)
        if attrs["normalize_eps"]:
            total = e.op("add", total, e.const(attrs["normalize_eps"], weights.dtype))
        weights = e.op("div", weights, total)
    if attrs["scale"] != 1.0:
        weights = e.op("mul", weights, e.const(attrs["scale"], weights.dtype))
    return weights, indices


def shared_expert(e: Emitter, x, shared: list, activation: str):
    """The shared expert's output for every token (None when the op has none)."""
    w_gate, w_up, w_down, gate = shared
    if w_gate is None:
        return None
    hidden = e.op("mul", e.activation(activation, e.op("linear", x, w_gate, None)),
                  e.op("linear", x, w_up, None))
    out = e.op("linear", hidden, w_down, None)
    if gate is not None:
        out = e.op("mul", e.op("sigmoid", e.op("linear", x, gate, None)), out)
    return out


@decomposes("moe")
def _moe(e: Emitter, inputs, attrs):
    inputs = padded(list(inputs))
    routed = routed_experts(e, *inputs[:7], attrs)
    shared = shared_expert(e, inputs[0], inputs[7:], attrs["activation"])
    return [routed if shared is None else e.op("add", routed, shared)]


def routed_experts(e: Emitter, x, logits, w_gate_up, w_down, b_gate_up, b_down, score_bias,
                   attrs, rows: Callable[[Emitter, Value], Value] | None = None) -> Value:
    """The routed experts' weighted sum: every expert on every token, the unchosen masked out.
    `rows`, when given, rounds each expert's inputs row by row first (quantized_moe's int8
    activations: x before gate/up, the gated hidden before down)."""
    rows = rows or (lambda _, v: v)
    experts, inter = logits.shape[1], w_down.shape[1]
    weights, indices = route(e, logits, score_bias, attrs)
    # chosen[t, j, e]: token t's j-th choice is expert e; per expert: its weight, chosen or not
    chosen = e.op("eq", e.op("reshape", indices, shape=[*indices.shape, 1]),
                  e.op("arange", start=0, end=experts, step=1, dtype=DType.i64))
    zero = e.const(0.0, x.dtype)
    per_expert = e.op("sum", e.op("where", chosen, e.op("reshape", weights,
                                                        shape=[*weights.shape, 1]), zero),
                      dims=[1], keepdim=False)
    picked = e.op("any", chosen, dims=[1], keepdim=False)
    hidden = e.op("matmul", rows(e, x), w_gate_up)  # [experts, tokens, 2 * inter]
    if b_gate_up is not None:
        hidden = e.op("add", hidden, e.op("reshape", b_gate_up, shape=[experts, 1, 2 * inter]))
    gate = e.op("slice", hidden, dim=2, start=0, end=inter, step=1)
    up = e.op("slice", hidden, dim=2, start=inter, end=2 * inter, step=1)
    gated = rows(e, e.op("mul", e.activation(attrs["activation"], gate), up))
    out = e.op("matmul", gated, w_down)
    if b_down is not None:
        out = e.op("add", out, e.op("reshape", b_down, shape=[experts, 1, x.shape[1]]))
    column = [experts, x.shape[0], 1]
    weight = e.op("reshape", e.op("permute", per_expert, dims=[1, 0]), shape=column)
    mask = e.op("reshape", e.op("permute", picked, dims=[1, 0]), shape=column)
    return e.op("sum", e.op("where", mask, e.op("mul", out, weight), zero), dims=[0],
                keepdim=False)
