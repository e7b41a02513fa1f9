"""The mixture-of-experts block as one op: routing, the routed experts, their weighted sum.

`moe(x, logits, w_gate_up, w_down, ...)` is what a sparse MoE layer computes from its hidden
states x [tokens, hidden] and its router's logits [tokens, experts]:

- routing picks `top_k` experts per token and their weights. `routing` says how:
  `softmax_topk` (softmax over all experts, then the k largest: Mixtral, Qwen-MoE, OLMoE),
  `topk_softmax` (the k largest logits, then a softmax over them: GPT-OSS, Granite-MoE) or
  `sigmoid_topk` (sigmoid scores: DeepSeek-V3). A `score_bias` [experts] is added to the scores
  for the choice only (DeepSeek's bias correction); the weights are the unbiased scores.
  `normalize` divides the k weights by their sum (plus `normalize_eps`), `scale` multiplies them.
- each routed expert e is a gated MLP with stacked weights: w_gate_up [experts, hidden, 2 *
  inter] (gate columns first, then up; the in_out layout transformers' grouped path uses),
  w_down [experts, inter, hidden], optional biases [experts, 2 * inter] and [experts, hidden]:
  expert_e(x) = (activation(x @ gate_e) * (x @ up_e)) @ down_e.
- out[t] = sum over the chosen e of weight[t, e] * expert_e(x[t]).

The decomposition below is the op's meaning (the reference backend runs it): every expert on
every token, the unchosen ones masked out with `where` (so an unchosen expert's inf or NaN never
reaches the sum, as in eager, which never computes it). A backend's kernel computes only the
chosen experts: onnxruntime lowers it to com.microsoft.MoE. The summation order over the k experts
differs from eager's, within the fp32 reordering bound.
"""

from __future__ import annotations

from ..dtypes import DType
from ..symbolic import equal
from ..types import TensorType
from .fused import ACTIVATIONS, Emitter, _reference, decomposes
from .registry import REQUIRED, ShapeError, define

ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_topk")


def _fits(t: TensorType | None, dims) -> bool:
    return t is not None and t.rank == len(dims) and all(equal(a, b) for a, b in zip(t.shape, dims))


def _moe_rule(types, attrs):
    x, logits, w_gate_up, w_down, b_gate_up, b_down, score_bias = types
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
    return [x]


define("moe", "x logits w_gate_up w_down b_gate_up? b_down? score_bias?", _moe_rule,
       _reference("moe"), "fused",
       "mixture of experts: route each token to top_k experts by its logits, sum their gated "
       "MLPs weighted by the routing weights", top_k=REQUIRED, routing="softmax_topk",
       normalize=False, normalize_eps=0.0, scale=1.0, activation="silu")


def route(e: Emitter, logits, score_bias, attrs):
    """(weights [tokens, k], expert indices [tokens, k]) as the routing attributes say."""
    k, routing = attrs["top_k"], attrs["routing"]
    if routing == "topk_softmax":
        scores = logits
    else:
        scores = e.op("softmax" if routing == "softmax_topk" else "sigmoid", logits,
                      **({"dim": -1} if routing == "softmax_topk" else {}))
    choice = scores if score_bias is None else e.op("add", scores, score_bias)
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


@decomposes("moe")
def _moe(e: Emitter, inputs, attrs):
    x, logits, w_gate_up, w_down, b_gate_up, b_down, score_bias = inputs
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
    hidden = e.op("matmul", x, w_gate_up)  # [experts, tokens, 2 * inter]
    if b_gate_up is not None:
        hidden = e.op("add", hidden, e.op("reshape", b_gate_up, shape=[experts, 1, 2 * inter]))
    gate = e.op("slice", hidden, dim=2, start=0, end=inter, step=1)
    up = e.op("slice", hidden, dim=2, start=inter, end=2 * inter, step=1)
    out = e.op("matmul", e.op("mul", e.activation(attrs["activation"], gate), up), w_down)
    if b_down is not None:
        out = e.op("add", out, e.op("reshape", b_down, shape=[experts, 1, x.shape[1]]))
    column = [experts, x.shape[0], 1]
    weight = e.op("reshape", e.op("permute", per_expert, dims=[1, 0]), shape=column)
    mask = e.op("reshape", e.op("permute", picked, dims=[1, 0]), shape=column)
    return [e.op("sum", e.op("where", mask, e.op("mul", out, weight), zero), dims=[0],
                 keepdim=False)]
