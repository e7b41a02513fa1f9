"""Horizontal merge: linears that read one input become one linear over concatenated weights.

Q/K/V projections (and gate/up when they are not already a gated_mlp) all read the same
activations; one wide matmul reads them once and runs at a better shape. Quantized linears
(`quantized_linear`, blockwise along the input features) merge the same way, when their bits,
group size and activation precision agree: their codes and scales stack by output row, and an
int8-activation product quantizes the shared input once instead of once per projection. The
merged weight (and bias) is concatenated at compile time into a new weight in
`graph.weight_data`, and each original result becomes a `slice` of the merged one. Found first,
applied after: `find_groups` only reads the graph; `merge_group` changes it and returns a record
like any rewrite.

Merged only when it is exact and cheap: every weight (and bias) is a graph weight with data (in
memory, or a lazy handle that stacks without being read), all of one dtype, with no bias or all
with one, and each original weight read by nothing else (otherwise its bytes would be stored
twice).
"""

from __future__ import annotations

from compiler.ir import Graph, Node, TensorType, Value
from compiler.ir.weights import concat_rows, is_lazy

from ..rewrite import RewriteBuilder, RewriteRecord
from ..rewrite.match import same_dim as equal

_MIN_GROUP = 2


def _known_weight(graph: Graph, value: Value | None) -> bool:
    """A weight with data: a tensor in memory, or a lazy handle (a checkpoint tensor, a
    quantization still to compute), which `concat_rows` stacks lazily so the merged weight
    streams like any other."""
    import numpy as np
    import torch

    if value is None or not graph.is_weight(value):
        return False
    data = graph.weight_data.get(value.name)
    return isinstance(data, (torch.Tensor, np.ndarray)) or is_lazy(data)


_MERGEABLE = ("linear", "quantized_linear")


def _parts(node: Node) -> tuple[Value, list[Value], Value | None]:
    """(input, the row-stacked weights: the weight, or the codes and scales; the bias)."""
    if node.op == "linear":
        return node.inputs[0], [node.inputs[1]], node.inputs[2]
    return node.inputs[0], [node.inputs[1], node.inputs[2]], node.inputs[3]


def _kind(node: Node) -> tuple:
    """What must agree for nodes to merge besides their input: op, dtype, in-features and the
    quantization."""
    if node.op == "linear":
        return ("linear", node.inputs[1].dtype, str(node.inputs[1].shape[1]))
    a = node.attrs
    return ("quantized_linear", node.inputs[2].dtype, a["in_features"], a["bits"],
            a["group_size"], a.get("activations", "float"))


def _mergeable(graph: Graph, node: Node, readers: dict, returned: set[int]) -> bool:
    if node.op not in _MERGEABLE:
        return False
    _, stacked, b = _parts(node)
    params = stacked if b is None else [*stacked, b]
    return all(_known_weight(graph, p) and len(readers[p]) == 1 and id(p) not in returned
               for p in params)


def find_groups(graph: Graph) -> list[list[Node]]:
    """Linears that can merge, grouped by (input, dtype, in-features, with bias); read-only."""
    readers = graph.users()
    returned = {id(v) for v in graph.outputs}
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        if _mergeable(graph, node, readers, returned):
            x, _, b = _parts(node)
            key = (id(x), _kind(node), b is None)
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
    """Replace `nodes` (linears, or quantized linears, of one input) by one and slices of its
    result."""
    first = nodes[0]
    x = first.inputs[0]
    rows = [n.outputs[0].shape[-1] for n in nodes]
    builder = RewriteBuilder(graph, first)
    stacks = list(zip(*(_parts(n)[1] for n in nodes)))  # per stacked parameter, every node's
    biases = [_parts(n)[2] for n in nodes]
    merged_params = [_stack(graph, builder, list(stack)) for stack in stacks]
    bias = _stack(graph, builder, biases) if biases[0] is not None else None
    if first.op == "linear":
        merged = builder.linear(x, merged_params[0], bias)
    else:
        attrs = {k: v for k, v in first.attrs.items() if k != "origin"}
        merged = builder.quantized_linear(x, *merged_params, bias, **attrs)
    origin = [entry for n in nodes
              for entry in n.attrs.get("origin", [f"%{n.output.name} {n.op}"])]
    merged.producer.attrs = {**merged.producer.attrs, "origin": origin}
    start = 0
    for node, size in zip(nodes, rows):
        part = builder.slice(merged, dim=-1, start=start, end=start + size, step=1)
        graph.replace_uses(node.output, part)
        part.name = node.output.name  # the slice stands for the old result: keep its name
        start += size
    graph.remove_nodes(nodes)
    for p in [p for stack in stacks for p in stack] + [b for b in biases if b is not None]:
        del graph.weights[p.name]
        graph.weight_data.pop(p.name, None)
    return RewriteRecord("merge_linears", f"%{first.output.name} {first.op}", first.loc,
                         tuple(origin), tuple(f"%{n.outputs[0].name} {n.op}"
                                              for n in builder.created))


def _stack(graph: Graph, builder: RewriteBuilder, params: list[Value]) -> Value:
    """One weight: `params` stacked along their first dim (lazily for checkpoint weights)."""
    data = concat_rows([graph.weight_data[p.name] for p in params])
    shape = (sum(p.shape[0] for p in params), *params[0].shape[1:])
    return builder.weight(merged_name([p.name for p in params]), data,
                          TensorType(params[0].dtype, shape))


def merge_horizontal(graph: Graph) -> list[RewriteRecord]:
    """Merge every group `find_groups` finds; the records of the merges."""
    return [merge_group(graph, nodes) for nodes in find_groups(graph)]
