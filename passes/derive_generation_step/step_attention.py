"""The attentions of a generation step, paged: a fused block or a bare attention op.

derive_generation_step (passes/derive_generation_step/__init__.py) turns every causal attention of a
forward into `paged_attention` over its layer's cache pool. A block the fusion recognised
(`multi_head_attention`) already has the paged op's operands: the [1, S, heads * head_size]
projections and the rotary tables. Any other attention is a `scaled_dot_product_attention` over
[1, heads, S, head_size] query, key and value, computed however the model computes them: a
rotary on part of each head and a concat, a fused QKV split any way, q/k norms. Those are
cached *as they enter the attention*: the step's paged op takes the query, key and value with
the heads merged back to [1, S, heads * head_size] and no rotary (it is already in them), and
its result is split back into heads where the attention's was read. Whether query, key and value
are computed token by token (so the step's rows are the forward's) is proven afterwards, over
the whole step, by passes/derive_generation_step/token_rows.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Graph
from compiler.ir.dtypes import DType
from compiler.ir.graph import Node, Value
from compiler.ir.symbolic import equal
from compiler.ir.types import TensorType

SDPA = "scaled_dot_product_attention"
HEADS_FIRST = [0, 2, 1, 3]  # [b, s, h, d] <-> [b, h, s, d]


@dataclass(frozen=True)
class Pool:
    """One layer's cache: its index (names the pool inputs and the key/value outputs), the
    pool's slot symbol, the step's slot lists, and whether the pool is int8."""

    layer: int
    slots: object
    shared: list
    int8: bool


def heads_misfit(node: Node, tokens) -> str | None:
    """None when the attention's q, k and v are [1, heads, tokens, size] with whole groups of
    query heads per key head, as paged_attention pages them; else why not."""
    q, k, v = node.inputs[:3]
    if any(x.type.rank != 4 or not equal(x.shape[0], 1) or not equal(x.shape[2], tokens)
           for x in (q, k, v)):
        return (f"its query {q.type}, key {k.type} and value {v.type} are not [1, heads, "
                "tokens, head_size] (the step packs the tokens of several sequences on one axis)")
    heads, kv_heads, size = q.shape[1], k.shape[1], q.shape[3]
    if not all(isinstance(d, int) for d in (heads, kv_heads, size, v.shape[1], v.shape[3])):
        return "its head counts and head sizes are not static"
    if v.shape[1] != kv_heads or k.shape[3] != size or heads % kv_heads \
            or (heads != kv_heads and not node.attrs.get("enable_gqa")):
        return (f"its {heads} query heads of {size}, {kv_heads} key heads of {k.shape[3]} and "
                f"{v.shape[1]} value heads do not pair up")
    return None


def paged_block(graph: Graph, block: Node, operands: list, pool: Pool, heads: int | None = None,
                kv_heads: int | None = None) -> Node:
    """A `paged_attention` node standing for `block` (q, k, v, cos, sin in `operands`) over the
    layer's pools, added before it; heads default to the block's attributes."""
    q, k, v = operands[:3]
    heads = block.attrs["num_heads"] if heads is None else heads
    kv_heads = block.attrs["kv_num_heads"] if kv_heads is None else kv_heads
    size, v_size = k.shape[-1] // kv_heads, v.shape[-1] // kv_heads
    caches = [graph.add_input(f"{name}_cache_{pool.layer}",
                              TensorType(DType.i8 if pool.int8 else q.dtype,
                                         (pool.slots, kv_heads, width)))
              for name, width in (("k", size), ("v", v_size))]
    scales = [graph.add_input(f"{name}_scale_{pool.layer}",
                              TensorType(DType.f32, (pool.slots, kv_heads)))
              for name in ("k", "v")] if pool.int8 else []
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads, "scale": block.attrs["scale"],
             "window": block.attrs.get("window"), "softcap": block.attrs.get("softcap")}
    return graph.add_node("paged_attention", [*operands, *caches, *pool.shared, *scales], attrs,
                          loc=block.loc, before=block,
                          names=[block.outputs[0].name + "_paged", f"key_{pool.layer}",
                                 f"value_{pool.layer}"])


def replace(graph: Graph, block: Node, paged: Node, result: Value | None = None) -> None:
    """`paged` (or `result`, computed from it) answers for `block`; its cache rows become
    outputs the runtime writes."""
    graph.replace_uses(block.outputs[0], paged.outputs[0] if result is None else result)
    graph.remove_nodes([block])
    graph.outputs.extend(paged.outputs[1:])
    graph.version += 1


def page_sdpa(graph: Graph, node: Node, pool: Pool) -> None:
    """scaled_dot_product_attention(q, k, v, is_causal) -> paged_attention on the merged heads,
    its result split back into heads [1, heads, S, v_size]."""
    q, k, v = node.inputs[:3]
    merged = [_merged_heads(graph, x, node) for x in (q, k, v)]
    paged = paged_block(graph, node, [*merged, None, None], pool, q.shape[1], k.shape[1])
    out = node.outputs[0]
    _, heads, tokens, v_size = out.shape
    tokens_first = graph.add_node("reshape", [paged.outputs[0]],
                                  {"shape": [1, tokens, heads, v_size]}, loc=node.loc,
                                  before=node, names=[out.name + "_rows"]).outputs[0]
    # a head merge reading the attention ([1, S, h, d] by a permute) reads the rows directly
    for user in [u for u in out.users if u.op == "permute" and
                 list(u.attrs["dims"]) == HEADS_FIRST]:
        graph.replace_uses(user.outputs[0], tokens_first)
    result = graph.add_node("permute", [tokens_first], {"dims": HEADS_FIRST}, loc=node.loc,
                            before=node, names=[out.name + "_heads"]).outputs[0]
    replace(graph, node, paged, result)


def _merged_heads(graph: Graph, x: Value, node: Node) -> Value:
    """[1, h, S, d] -> [1, S, h * d]; a head split of a [1, S, h * d] projection is undone by
    reading the projection."""
    _, heads, tokens, size = x.shape
    split = x.producer
    if split is not None and split.op == "permute" and list(split.attrs["dims"]) == HEADS_FIRST:
        rows = split.inputs[0]
        if rows.producer is not None and rows.producer.op == "reshape" \
                and tuple(rows.producer.inputs[0].shape) == (1, tokens, heads * size):
            return rows.producer.inputs[0]
        return graph.add_node("reshape", [rows], {"shape": [1, tokens, heads * size]},
                              loc=node.loc, before=node,
                              names=[x.name + "_merged"]).outputs[0]
    tokens_first = graph.add_node("permute", [x], {"dims": HEADS_FIRST}, loc=node.loc,
                                  before=node, names=[x.name + "_rows"]).outputs[0]
    return graph.add_node("reshape", [tokens_first], {"shape": [1, tokens, heads * size]},
                          loc=node.loc, before=node, names=[x.name + "_merged"]).outputs[0]
