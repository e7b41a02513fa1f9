"""Which `moe` routing made a router's (weights, indices): read back from the exported graph.

The forms are recognised by what the graph computes, never by model class:
- the scores: a softmax over the experts (Mixtral, Qwen2/3-MoE, OLMoE, Phi-MoE, MiniMax,
  DeepSeek-V2), a sigmoid (DeepSeek-V3, GLM-4-MoE), or the logits themselves when the softmax
  comes after the top-k (GPT-OSS, Granite-MoE: `topk_softmax`);
- a score bias added for the choice only (DeepSeek-V3's `e_score_correction_bias`): a weight [E];
- group-limited selection (DeepSeek-V2's group_limited_greedy, V3, GLM-4-MoE): the scores viewed
  as [tokens, groups, E / groups], each group scored by the sum of its best `group_top`
  (`max` is the best one), the best `topk_group` groups scattered into a mask, spread back over
  the experts, and the rest filled with a constant (`masked_fill`);
- the weights: the top-k values, or the unbiased scores gathered at the chosen experts, then
  optionally divided by their sum (plus an epsilon) and multiplied by a constant
  (`routed_scaling_factor`).
Anything else is described in words (the fusion report's reason) and stays unfused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.ir import Graph, Value

from ..rewrite.match import constant_value
from .common import last_axis


@dataclass(frozen=True)
class Routing:
    logits: Value
    score_bias: Value | None
    attrs: dict[str, Any]


def strip_cast(value: Value) -> Value:
    while value.producer is not None and value.producer.op == "cast" \
            and value.producer.inputs[0].dtype == value.dtype:
        value = value.producer.inputs[0]
    return value


def _op(value: Value | None, *ops: str):
    """The node producing `value` (casts to the same dtype looked through) if it is one of ops."""
    if value is None:
        return None
    node = strip_cast(value).producer
    return node if node is not None and node.op in ops else None


def _scale(graph: Graph, weights: Value) -> tuple[Value, dict]:
    node = _op(weights, "mul")
    if node is None:
        return weights, {}
    for i in (0, 1):
        factor = constant_value(graph, node.inputs[1 - i])
        if isinstance(factor, (int, float)) and not isinstance(factor, bool) \
                and node.inputs[1 - i].type.rank == 0:
            return strip_cast(node.inputs[i]), {"scale": float(factor)}
    return weights, {}


def _normalize(graph: Graph, weights: Value) -> tuple[Value, dict] | str:
    node = _op(weights, "div")
    if node is None or node.attrs.get("rounding_mode") is not None:
        return weights, {}
    total, eps = node.inputs[1], 0.0
    plus = _op(total, "add")
    if plus is not None:
        for i in (0, 1):
            found = constant_value(graph, plus.inputs[1 - i])
            if isinstance(found, float) and plus.inputs[1 - i].type.rank == 0:
                total, eps = plus.inputs[i], found
                break
    total_node = _op(total, "sum")
    numerator = strip_cast(node.inputs[0])
    if (total_node is None or not total_node.attrs["keepdim"]
            or strip_cast(total_node.inputs[0]) is not numerator
            or len(total_node.attrs["dims"]) != 1
            or not last_axis(total_node.attrs["dims"][0], numerator.type.rank)):
        return "the routing weights are divided by something other than their sum"
    return numerator, {"normalize": True, "normalize_eps": float(eps)}


def _group_scores(graph: Graph, scores: Value, inner: Value) -> tuple[int, int] | str:
    """(n_group, group_top) when `scores` [T, G] scores the groups of `inner` [T, E]."""
    summed = _op(scores, "sum")
    if summed is not None:
        best = _op(summed.inputs[0], "topk")
        if best is None or best.outputs[0] is not strip_cast(summed.inputs[0]) \
                or summed.attrs["keepdim"] or summed.attrs["dims"] not in ([-1], [2]):
            return "the group scores are not the sum of each group's best scores"
        grouped, top = best.inputs[0], best.attrs["k"]
        if not (best.attrs["largest"] and last_axis(best.attrs["dim"], 3)):
            return "the group scores are not of each group's largest scores"
    else:
        best = _op(scores, "amax")
        if best is None or best.attrs["keepdim"] or best.attrs["dims"] not in ([-1], [2]):
            return "the group scores are not each group's best score or the sum of its best"
        grouped, top = best.inputs[0], 1
    view = _op(grouped, "reshape")
    if view is None or strip_cast(view.inputs[0]) is not inner or grouped.type.rank != 3:
        return "the group scores are not of the expert scores viewed as [tokens, groups, size]"
    return int(grouped.shape[1]), int(top)


def _kept_groups(graph: Graph, mask: Value) -> tuple[Value, int] | str:
    """(group scores, topk_group) when bool `mask` [T, E] is 'the expert's group is kept'."""
    flat = _op(mask, "reshape")
    spread = _op(flat.inputs[0], "expand") if flat is not None else None
    column = _op(spread.inputs[0], "reshape") if spread is not None else None
    scatter = _op(column.inputs[0], "scatter") if column is not None else None
    if scatter is None or scatter.attrs["reduce"] != "none" or column.inputs[0].type.rank != 2 \
            or not last_axis(scatter.attrs["dim"], 2) \
            or constant_value(graph, scatter.inputs[0]) != 0 \
            or constant_value(graph, scatter.inputs[2]) != 1:
        return "the group mask is not a scatter of ones at the kept groups, spread over experts"
    top = _op(scatter.inputs[1], "topk")
    if top is None or top.outputs[1] is not strip_cast(scatter.inputs[1]) \
            or not top.attrs["largest"] or not last_axis(top.attrs["dim"], 2):
        return "the kept groups are not the top-k of the group scores"
    return top.inputs[0], int(top.attrs["k"])


def _group_limit(graph: Graph, choice: Value) -> tuple[Value, dict] | str:
    """The choice scores before the group mask and the group attributes (none: unchanged)."""
    node = _op(choice, "where")
    if node is None:
        return choice, {}
    cond, fill_first = node.inputs[0], True
    negated = _op(cond, "bitwise_not", "logical_not")
    if negated is not None:
        cond = negated.inputs[0]
    else:
        fill_first = False
    fill_at, inner = (1, 2) if fill_first else (2, 1)
    fill = constant_value(graph, node.inputs[fill_at])
    if not isinstance(fill, float):
        return "the choice scores are masked by something other than a constant group fill"
    mask = cond.producer.inputs[0] if cond.producer is not None and cond.producer.op == "cast" \
        else cond
    kept = _kept_groups(graph, mask)
    if isinstance(kept, str):
        return kept
    inner_value = strip_cast(node.inputs[inner])
    group = _group_scores(graph, kept[0], inner_value)
    if isinstance(group, str):
        return group
    return inner_value, {"n_group": group[0], "group_top": group[1], "topk_group": kept[1],
                         "group_fill": fill}


def _bias(graph: Graph, choice: Value) -> tuple[Value, Value | None]:
    node = _op(choice, "add")
    if node is not None:
        for i in (0, 1):
            bias = strip_cast(node.inputs[1 - i])
            if graph.is_weight(bias) and bias.type.rank == 1 \
                    and bias.shape[0] == choice.shape[-1]:
                return strip_cast(node.inputs[i]), bias
    return choice, None


def _scores(scores: Value) -> tuple[Value, str] | str:
    node = _op(scores, "softmax", "sigmoid")
    if node is None or (node.op == "softmax"
                        and not last_axis(node.attrs["dim"], scores.type.rank)):
        return "the router's top-k scores are not a softmax or a sigmoid over the experts"
    return node.inputs[0], "softmax_topk" if node.op == "softmax" else "sigmoid_topk"


def routing_of(graph: Graph, weights: Value, indices: Value) -> Routing | str:
    """The routing that made (weights, indices), or why it is not one `moe` can express."""
    topk = indices.producer
    if topk is None or topk.op != "topk" or topk.outputs[1] is not indices:
        return f"%{indices.name} is not the indices of a topk"
    if not (topk.attrs["largest"] and last_axis(topk.attrs["dim"], topk.inputs[0].type.rank)):
        return "the router's topk is not of the largest scores along the experts"
    weights, scale = _scale(graph, strip_cast(weights))
    found = _normalize(graph, weights)
    if isinstance(found, str):
        return found
    weights, normalize = found
    attrs = {"normalize": False, **normalize, **scale}
    soft = _op(weights, "softmax")
    if soft is not None and strip_cast(soft.inputs[0]) is topk.outputs[0]:
        if attrs != {"normalize": False}:
            return "a softmax over the top-k logits is neither renormalised nor scaled by moe"
        return Routing(strip_cast(topk.inputs[0]), None, {"routing": "topk_softmax", **attrs})
    limited = _group_limit(graph, strip_cast(topk.inputs[0]))
    if isinstance(limited, str):
        return limited
    choice, group = limited
    scores, bias = _bias(graph, choice)
    gathered = _op(weights, "gather")
    if gathered is not None:
        if strip_cast(gathered.inputs[1]) is not indices or strip_cast(gathered.inputs[0]) \
                is not scores or not last_axis(gathered.attrs["dim"], 2):
            return "the routing weights are gathered from other than the scores at the top-k"
        if group and bias is None:
            return "the routing weights are the unmasked scores of a group-limited choice"
    elif weights is not topk.outputs[0]:
        return "the routing weights are not the top-k scores, their softmax, their gather or " \
               "their normalised sum"
    elif bias is not None:
        return "the routing weights are the bias-corrected choice scores"
    found = _scores(scores)
    if isinstance(found, str):
        return found
    logits, routing = found
    return Routing(strip_cast(logits), bias, {"routing": routing, **attrs, **group})
