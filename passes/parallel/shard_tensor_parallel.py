"""Megatron-style tensor-parallel placement, found from the graph's dataflow alone.

Walking the matmul-like nodes (`linear`, `matmul` by a 2-d weight) in order, with sharding
propagated from the seeds chosen so far:

- one whose input arrives split along its features gets its weight split along the input
  features (row parallel: attention output and down projections), making a partial sum;
- one whose input is whole gets its weight split along the output features (column parallel:
  Q/K/V, gate/up, and the LM head, whose output is then split by vocabulary), if that split
  reaches a row-parallel partner or a graph output without having to be gathered (a fused QKV
  sliced apart, or a norm over the split features, would need one: that weight stays whole);
- an `embedding` table is split by rows (vocabulary parallel).

Propagation then carries the column splits through reshapes into attention heads and KV heads,
through rotary embeddings and gated activations, and turns each partial sum into one all-reduce
where the residual add needs the whole value: one per attention block and one per MLP block. No
layer names or model classes are consulted, so any transformer written with matmuls works. Heads
that do not divide by the tensor-parallel size are an error naming `parallel.tensor_parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, Value, format_node
from passes.base import Pass, PassResult
from passes.registry import register_pass

from .layout import Layout, divisible
from .propagate_sharding import _Memo, infer_layouts
from .rules_view import reshape_blocks

KEY = "parallel.tensor_parallel"
ROWS = Layout((("tp", 0),))  # an embedding table split by rows (vocabulary)


def _where(node: Node) -> str:
    return f"node `{format_node(node)}`" + (f" from {node.loc}" if node.loc else "")


def check_heads(graph: Graph, tp: int) -> None:
    """Attention heads must divide evenly over the tensor-parallel ranks."""
    for node in graph.nodes:
        if node.op == "paged_attention":
            _check_paged_heads(node, tp)
        if node.op != "scaled_dot_product_attention" or node.inputs[0].type.rank < 3:
            continue
        for role, value in (("attention heads", node.inputs[0]), ("KV heads", node.inputs[1])):
            heads = value.type.shape[-3]
            if isinstance(heads, int) and heads % tp:
                raise DayzeroError(
                    f"config key '{KEY}' = {tp} does not divide the {heads} {role} of "
                    f"scaled_dot_product_attention %{node.outputs[0].name}", _where(node),
                    f"choose a {KEY} that divides the number of heads ({heads})")


def _check_paged_heads(node: Node, tp: int) -> None:
    """A generation step's KV cache is sharded by KV heads: both head counts divide by tp."""
    for role, heads in (("attention heads", node.attrs["num_heads"]),
                        ("KV heads", node.attrs["kv_num_heads"])):
        if heads % tp:
            raise DayzeroError(
                f"config key '{KEY}' = {tp} does not divide the {heads} {role} of "
                f"paged_attention %{node.outputs[0].name}: a tensor-parallel generation step "
                "gives every rank whole heads and shards the KV cache by KV heads", _where(node),
                f"choose a {KEY} that divides the number of KV heads ({node.attrs['kv_num_heads']})"
                f" and attention heads ({node.attrs['num_heads']})")


def _seed(graph: Graph, node: Node, index: int, layout: Layout) -> tuple:
    """Put `shard(operand) {layout}` in front of `node`'s operand `index` (shared per value);
    returns what `_unseed` needs to take it back."""
    value = node.inputs[index]
    for other in graph.nodes:
        if other.op == "shard" and other.inputs[0] is value and \
                other.attrs["layout"] == str(layout):
            graph.set_input(node, index, other.output)
            return node, index, value, None
    first = next(n for n in graph.nodes if value in n.inputs)
    seed = graph.add_node("shard", [value], {"layout": str(layout)}, loc=first.loc,
                          names=[f"{value.name}.tp"], before=first)
    graph.set_input(node, index, seed.output)
    return node, index, value, seed


def _unseed(graph: Graph, record: tuple) -> None:
    node, index, value, seed = record
    graph.set_input(node, index, value)
    if seed is not None and not seed.output.uses:
        graph.remove_nodes([seed])


def _split_bias(graph: Graph, node: Node) -> None:
    """linear(x, w, b) -> add(linear(x, w), b): a row-parallel bias is added once, after the
    partial sums are reduced, not once per rank."""
    bias, out = node.inputs[2], node.output
    graph.set_input(node, 2, None)
    anchor = graph.index(node) + 1
    add = graph.add_node("add", [out, bias], loc=node.loc, names=[f"{out.name}.bias"],
                         before=graph.nodes[anchor] if anchor < len(graph.nodes) else None)
    for user, i in list(out.uses):
        if user is not add:
            graph.set_input(user, i, add.output)
    graph.outputs = [add.output if v is out else v for v in graph.outputs]


def _weight(graph: Graph, value: Value | None) -> bool:
    return value is not None and graph.is_weight(value) and value.type.rank == 2


# matmul-like op -> (output-features dim, input-features dim) of its 2-d weight operand 1
_WEIGHT_DIMS = {"linear": (0, 1), "matmul": (1, 0)}


def _gathers(graph: Graph, tp: int, memo: _Memo) -> list:
    """Places where a tensor-parallel split has to be gathered back (in graph order), except
    at the input of a matmul by a weight still to be placed: it will become row parallel."""
    found = []
    for node, index, have, want in infer_layouts(graph, {"tp": tp}, memo=memo).needs:
        if have.dim_of("tp") is None or want.dim_of("tp") == have.dim_of("tp"):
            continue
        if index == 0 and node.op in _WEIGHT_DIMS and _weight(graph, node.inputs[1]):
            continue
        found.append((node, have))
    return found


def _place_matmul(graph: Graph, node: Node, tp: int, memo: _Memo) -> bool:
    """Row parallel when the input arrives split by features; else try column parallel, and
    keep it only if the split reaches a partner (or an output) without being gathered."""
    out_dim, in_dim = _WEIGHT_DIMS[node.op]
    weight = node.inputs[1].type.shape
    x = infer_layouts(graph, {"tp": tp}, memo=memo, stop=node).of(node.inputs[0])
    if x.dim_of("tp") == node.inputs[0].type.rank - 1 and divisible(weight[in_dim], tp):
        if node.op == "linear" and node.inputs[2] is not None:
            _split_bias(graph, node)
        _seed(graph, node, 1, Layout((("tp", in_dim),)))
        return True
    if "tp" in x.axes() or not divisible(weight[out_dim], tp):
        return False
    records = [_seed(graph, node, 1, Layout((("tp", out_dim),)))]
    if node.op == "linear" and node.inputs[2] is not None and graph.is_weight(node.inputs[2]):
        records.append(_seed(graph, node, 2, Layout((("tp", 0),))))
    gathers = _gathers(graph, tp, memo)
    if not gathers:
        return True
    first, layout = gathers[0]
    if first.op == "reshape":
        heads_error(first, layout.dim_of("tp"), tp)
    for record in reversed(records):  # e.g. a fused QKV sliced apart, a norm over the split
        _unseed(graph, record)
    return False


def place(graph: Graph, tp: int) -> bool:
    """Insert the seeds; returns whether any was placed."""
    memo = _Memo()
    placed = False
    for node in list(graph.nodes):
        if node.op == "embedding" and _weight(graph, node.inputs[0]) and \
                divisible(node.inputs[0].type.shape[0], tp):
            _seed(graph, node, 0, ROWS)
            placed = True
        elif node.op in _WEIGHT_DIMS and _weight(graph, node.inputs[1]):
            placed |= _place_matmul(graph, node, tp, memo)
    return placed


def heads_error(node: Node, split: int, tp: int) -> None:
    """A reshape that cannot carry a split into the heads it makes: heads % tp != 0."""
    src, dst = node.inputs[0].type.shape, node.output.type.shape
    for block_in, block_out in reshape_blocks(src, dst) or []:
        if split in block_in and block_out:
            heads = next((dst[d] for d in block_out if dst[d] != 1), dst[block_out[0]])
            raise DayzeroError(
                f"config key '{KEY}' = {tp} does not divide the {heads} heads that reshape "
                f"%{node.output.name} makes from a split dim of {src[split]} "
                f"({node.inputs[0].type} -> {node.output.type})", _where(node),
                f"choose a {KEY} that divides the number of attention heads and KV heads")


@register_pass
@dataclass(frozen=True)
class ShardTensorParallel(Pass):
    """Place Megatron-style tensor-parallel seeds on weights (column/row/vocabulary parallel).

    Needs: a graph with `linear` / `embedding` nodes reading 2-d weights. Guarantees: `shard`
    seeds on the weights to split (propagate_sharding spreads them), biases of row-parallel
    linears moved after the reduction, and an error naming `parallel.tensor_parallel` and the
    numbers when attention heads do not divide by `size`. Exists so that a model is split by
    configuration, not by rewriting its code.
    """

    name = "shard_tensor_parallel"
    summary = "choose column/row/vocabulary-parallel weight splits for tensor parallelism"
    size: int = 1

    def run(self, graph: Graph) -> PassResult:
        if self.size <= 1:
            return PassResult(graph, False)
        check_heads(graph, self.size)
        return PassResult(graph, place(graph, self.size))
