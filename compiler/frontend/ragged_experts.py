"""Expert loops over data-dependent splits, as exported, become one grouped matrix product.

Some MoE layers group their token-expert pairs by expert and split them by the per-expert counts
read back as Python ints (JetMoE's `inputs.split(expert_size.tolist())`, ScatterMoE's layout):

    sizes = counts.tolist()                     # _local_scalar_dense(select(counts, 0, i))
    parts = x.split(sizes)                      # split_with_sizes(x, [u0, u1, ...])
    out = cat([parts[i] @ w_i for i in ...])    # mm(getitem(parts, i), w_i), then cat

torch.export traces this with unbacked sizes u_i, which no IR type can hold. Row block i of x
times w_i, the blocks in order, is exactly `grouped_matmul(x, stack(w_i), cumsum(counts))`
(the IR op transformers' own grouped path lowers to), so the pattern is rewritten to that in the
FX graph before conversion: a `dayzero::grouped_mm` call, and the unbacked sizes are left read
only by torch's runtime assertions, which `drop_data_checks` removes. The pattern is matched on
the graph, not on a model class; a split whose parts are used any other way is left alone (and
reported as the data-dependent size it is).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from compiler.ir import get_op

aten = torch.ops.aten
LOCAL_SCALAR = aten._local_scalar_dense.default
# what lies between `counts` and the scalar read: the element, and views of it
ELEMENT_VIEWS = (aten.squeeze.default, aten.squeeze.dim, aten.view.default,
                 aten.reshape.default, aten.clone.default)


@torch.library.custom_op("dayzero::grouped_mm", mutates_args=())
def grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Row block g of input (offs[g-1] <= row < offs[g]) times weight[g]; rows from offs[-1]
    on are zero: the IR's grouped_matmul, whose reference it runs (argument names as
    transformers' grouped_mm_fallback, which converts the same way)."""
    return get_op("grouped_matmul").reference(input, weight, offs)


@grouped_mm.register_fake
def _(input, weight, offs):
    return input.new_empty(input.shape[0], weight.shape[2])


def _element(scalar: Node) -> tuple[Node, int] | None:
    """(counts, i) when `scalar` reads element i of the 1-d tensor counts: through
    `select(counts, 0, i)` or `unbind(counts)[i]`, and views of it."""
    if scalar.op != "call_function" or scalar.target is not LOCAL_SCALAR:
        return None
    node = scalar.args[0]
    while node.op == "call_function" and node.target in ELEMENT_VIEWS:
        node = node.args[0]
    if node.op != "call_function":
        return None
    if node.target is aten.select.int:
        counts, dim, index = node.args
    elif node.target is operator.getitem and node.args[0].target is aten.unbind.int:
        unbind, index = node.args
        counts, dim = unbind.args[0], unbind.args[1] if len(unbind.args) > 1 else 0
    else:
        return None
    val = counts.meta.get("val")
    if dim != 0 or not isinstance(val, torch.Tensor) or val.dim() != 1:
        return None
    return counts, index


def _ragged_split(split: Node) -> Node | None:
    """The counts tensor when `split` cuts x's rows by all of its elements, in order."""
    x, sizes = split.args[:2]
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    if dim % max(x.meta["val"].dim(), 1) != 0:
        return None
    if not isinstance(sizes, (list, tuple)) or not all(isinstance(s, Node) for s in sizes):
        return None
    elements = [_element(s) for s in sizes]
    if any(e is None for e in elements):
        return None
    counts = {e[0] for e in elements}
    if len(counts) != 1 or [e[1] for e in elements] != list(range(len(sizes))):
        return None
    (counts,) = counts
    return counts if counts.meta["val"].shape[0] == len(sizes) else None


def _right_operand(product: Node, part: Node) -> Node | None:
    """The [k, n] matrix `part` is multiplied by, in `mm(part, b)`, `matmul(part, b)` or
    `linear(part, w)` (no bias; b is w's transpose, made here as a `permute` node); None for
    any other use."""
    if product.target in (aten.mm.default, aten.matmul.default) and product.args[0] is part \
            and product.args[1].meta["val"].dim() == 2:
        return product.args[1]
    if product.target is aten.linear.default and product.args[0] is part \
            and (len(product.args) < 3 or product.args[2] is None):
        return None if "bias" in product.kwargs else product.args[1]
    return None


def _products(split: Node, parts: int) -> tuple[list[Node], list[Node], Node] | None:
    """(the product per part, their right operands, the cat of them all in order) when every
    part is used once, as the left operand of an mm or linear that only that cat reads."""
    getitems = sorted(split.users, key=lambda n: n.args[1] if len(n.args) > 1 else -1)
    if len(getitems) != parts or [g.args[1] for g in getitems] != list(range(parts)):
        return None
    products, operands = [], []
    for part in getitems:
        users = list(part.users)
        operand = _right_operand(users[0], part) if len(users) == 1 else None
        if operand is None:
            return None
        products.append(users[0])
        operands.append(operand)
    cats = {u for p in products for u in p.users}
    if len(cats) != 1 or any(len(p.users) != 1 for p in products):
        return None
    (cat,) = cats
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if cat.target is not aten.cat.default or list(cat.args[0]) != products or dim not in (0, -2):
        return None
    return products, operands, cat


def fold_ragged_expert_splits(graph: Graph) -> int:
    """Rewrite every split-by-counts expert loop in `graph` (in place); returns how many."""
    done = 0
    for split in [n for n in graph.nodes if n.op == "call_function"
                  and n.target is aten.split_with_sizes.default]:
        counts = _ragged_split(split)
        found = None if counts is None else _products(split, len(split.args[1]))
        if found is None:
            continue
        products, weights, cat = found
        linear = [p.target is aten.linear.default for p in products]  # [n, k] weights
        sizes = _symbols(split.args[1])
        out = _replace(graph, split.args[0], counts, weights, linear, cat)
        _retype_users(graph, out, sizes)
        for node in [cat, *products, *sorted(split.users, key=lambda n: n.args[1]), split]:
            graph.erase_node(node)
        done += 1
    if done:  # the size arithmetic only the split read: dead now (its checks stay, for now)
        graph.eliminate_dead_code()
    return done


def _replace(graph: Graph, x: Node, counts: Node, weights: list[Node], linear: list[bool],
             cat: Node) -> Node:
    """grouped_mm(x, stack of the [k, n] weights, cumsum(counts)) in place of `cat`; a
    linear's [n, k] weight is transposed first."""
    fake = torch._guards.detect_fake_mode([x.meta["val"], *(w.meta["val"] for w in weights)])
    made = []
    with graph.inserting_before(cat), fake:
        for i, transpose in enumerate(linear):
            if transpose:
                weights[i] = graph.call_function(aten.permute.default, (weights[i], [1, 0]))
                weights[i].meta["val"] = weights[i].args[0].meta["val"].t()
                made.append(weights[i])
        rows = [graph.call_function(aten.unsqueeze.default, (w, 0)) for w in weights]
        for row, w in zip(rows, weights):
            row.meta["val"] = w.meta["val"].unsqueeze(0)
        stack = graph.call_function(aten.cat.default, (rows, 0))
        stack.meta["val"] = torch.cat([r.meta["val"] for r in rows], 0)
        offsets = graph.call_function(aten.cumsum.default, (counts, 0))
        offsets.meta["val"] = torch.cumsum(counts.meta["val"], 0)
        out = graph.call_function(torch.ops.dayzero.grouped_mm.default, (x, stack, offsets))
        out.meta["val"] = grouped_mm(x.meta["val"], stack.meta["val"], offsets.meta["val"])
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in cat.meta:
            for node in (*made, *rows, stack, offsets, out):
                node.meta[key] = cat.meta[key]
    cat.replace_all_uses_with(out)
    return out


def _symbols(sizes: list[Node]) -> set:
    """The unbacked symbols the split's sizes are."""
    return {sym for s in sizes if isinstance(s.meta.get("val"), torch.SymInt)
            for sym in s.meta["val"].node.expr.free_symbols}


def _sized_by(val, symbols: set) -> bool:
    if isinstance(val, (tuple, list)):
        return any(_sized_by(v, symbols) for v in val)
    return isinstance(val, torch.Tensor) and any(
        isinstance(d, torch.SymInt) and d.node.expr.free_symbols & symbols for d in val.shape)


def _retype_users(graph: Graph, out: Node, symbols: set) -> None:
    """Recompute the fake values of the nodes downstream of `out` that torch sized by the
    split's unbacked sizes (their sum is out's row count, which torch only asserted): the
    converter checks every IR type against them."""
    fake = torch._guards.detect_fake_mode([out.meta["val"]])
    changed = {out}
    with fake:
        for node in list(graph.nodes):
            if node.op != "call_function" or not changed.intersection(node.all_input_nodes) \
                    or not _sized_by(node.meta.get("val"), symbols):
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                                 lambda n: n.meta.get("val"))
            try:
                node.meta["val"] = node.target(*args, **kwargs)
            except Exception:  # noqa: BLE001 - left as torch typed it; conversion reports it
                continue
            changed.add(node)
