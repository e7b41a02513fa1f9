"""Horizontal merge: linears that read one input become one linear over concatenated weights.

Q/K/V projections (and gate/up when they are not already a gated_mlp) all read the same
activations; one wide matmul reads them once and runs at a better shape. The merged weight (and
bias) is concatenated at compile time into a new weight in `graph.weight_data`, and each original
result becomes a `slice` of the merged one. Found first, applied after: `find_groups` only reads
the graph; `merge_group` changes it and returns a record like any rewrite.

Merged only when it is exact and cheap: every weight (and bias) is a graph weight with its data in
memory (not still in a checkpoint shard), all of one dtype, with no bias or all with one, and each
original weight read by nothing else (otherwise its bytes would be stored twice).
"""

from __future__ import annotations

from compiler.ir import Graph, Node, TensorType, Value
from compiler.ir.weights import concat_rows

from ..rewrite import RewriteBuilder, RewriteRecord
from ..rewrite.match import same_dim as equal

_MIN_GROUP = 2


def _known_weight(graph: Graph, value: Value | None) -> bool:
    """A weight whose data is in memory: a handle still lying in a checkpoint shard is not
    merged, because concatenating would read every such weight into memory at once."""
    import numpy as np
    import torch

    return value is not None and graph.is_weight(value) and isinstance(
        graph.weight_data.get(value.name), (torch.Tensor, np.ndarray))


def _mergeable(graph: Graph, node: Node, readers: dict, returned: set[int]) -> bool:
    if node.op != "linear":
        return False
    x, w, b = node.inputs
    params = [w] if b is None else [w, b]
    return all(_known_weight(graph, p) and len(readers[p]) == 1 and id(p) not in returned
               for p in params)


def find_groups(graph: Graph) -> list[list[Node]]:
    """Linears that can merge, grouped by (input, dtype, in-features, with bias); read-only."""
    readers = graph.users()
    returned = {id(v) for v in graph.outputs}
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        if _mergeable(graph, node, readers, returned):
            x, w, b = node.inputs
            key = (id(x), w.dtype, b is None)
            groups.setdefault(key, []).append(node)
    return [nodes for nodes in groups.values() if len(nodes) >= _MIN_GROUP
            and all(equal(n.inputs[1].shape[1], nodes[0].inputs[1].shape[1]) for n in nodes)]


def merged_name(names: list[str]) -> str:
    """`a.q_proj.weight` + `a.k_proj.weight` -> `a.q_proj+k_proj.weight`-style, without `+`.

    The common dotted prefix and suffix are kept and the differing middles joined by `_`:
    model.layers.0.self_attn.q_proj_k_proj_v_proj.weight.
    """
    parts = [n.split(".") for n in names]
    prefix = 0
    while all(len(p) > prefix + 1 and p[prefix] == parts[0][prefix] for p in parts):
        prefix += 1
    suffix = 0
    while all(len(p) > prefix + suffix + 1 and p[-1 - suffix] == parts[0][-1 - suffix]
              for p in parts):
        suffix += 1
    middles = ["_".join(p[prefix:len(p) - suffix]) for p in parts]
    return ".".join(parts[0][:prefix] + ["_".join(middles)] + parts[0][len(parts[0]) - suffix:])


def merge_group(graph: Graph, nodes: list[Node]) -> RewriteRecord:
    """Replace `nodes` (linears of one input) by one linear and slices of its result."""
    first = nodes[0]
    x = first.inputs[0]
    weights = [n.inputs[1] for n in nodes]
    biases = [n.inputs[2] for n in nodes]
    rows = [w.shape[0] for w in weights]
    total = sum(rows)
    builder = RewriteBuilder(graph, first)
    # concat_rows stays lazy for lazy (checkpoint-backed) weights: merging never reads them
    w_data = concat_rows([graph.weight_data[w.name] for w in weights])
    weight = builder.weight(merged_name([w.name for w in weights]), w_data,
                            TensorType(weights[0].dtype, (total, weights[0].shape[1])))
    bias = None
    if biases[0] is not None:
        b_data = concat_rows([graph.weight_data[b.name] for b in biases])
        bias = builder.weight(merged_name([b.name for b in biases]), b_data,
                              TensorType(biases[0].dtype, (total,)))
    merged = builder.linear(x, weight, bias)
    origin = [entry for n in nodes for entry in n.attrs.get("origin", [f"%{n.output.name} linear"])]
    merged.producer.attrs = {**merged.producer.attrs, "origin": origin}
    start = 0
    for node, size in zip(nodes, rows):
        part = builder.slice(merged, dim=-1, start=start, end=start + size, step=1)
        graph.replace_uses(node.output, part)
        part.name = node.output.name  # the slice stands for the old result: keep its name
        start += size
    graph.remove_nodes(nodes)
    for p in weights + [b for b in biases if b is not None]:
        del graph.weights[p.name]
        graph.weight_data.pop(p.name, None)
    return RewriteRecord("merge_linears", f"%{first.output.name} linear", first.loc,
                         tuple(origin), tuple(f"%{n.outputs[0].name} {n.op}"
                                              for n in builder.created))


def merge_horizontal(graph: Graph) -> list[RewriteRecord]:
    """Merge every group `find_groups` finds; the records of the merges."""
    return [merge_group(graph, nodes) for nodes in find_groups(graph)]
