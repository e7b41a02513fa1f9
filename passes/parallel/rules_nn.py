"""Sharding rules for contractions, embeddings, attention, reductions and normalizations.

The contractions are where tensor parallelism comes from: a weight split along its output dim
makes a linear's result split along its last dim (column parallel); an input split along the
contracted dim with the weight split the same way makes a partial sum (row parallel), which the
next op that is not linear in it turns into one all-reduce.
"""

from __future__ import annotations

from compiler.ir import Node
from compiler.ir.ops.shape_rules import norm_axis

from .layout import REPLICATED, Layout, divisible
from .rules import (
    Decision,
    broadcast_dims,
    carry,
    out_shape,
    replicate_all,
    rule,
    shape_of,
    want_broadcast,
)


@rule("linear")
def linear(node: Node, layouts, sizes) -> Decision:
    x_lay, w_lay = layouts[0], layouts[1]
    has_bias = node.inputs[2] is not None
    x_sh, w_sh = shape_of(node, 0), shape_of(node, 1)
    last = len(x_sh) - 1
    batch = {d: a for a, d in x_lay.splits if d != last and divisible(x_sh[d], sizes[a])}
    used = set(batch.values())
    k_axis = w_lay.axis_of(1) or x_lay.axis_of(last)
    if k_axis in used or has_bias or (k_axis and not divisible(x_sh[last], sizes[k_axis])):
        k_axis = None
    n_axis = w_lay.axis_of(0)
    if n_axis in used or n_axis == k_axis or (n_axis and not divisible(w_sh[0], sizes[n_axis])):
        n_axis = None
    kept: list[str] = []  # a partial input is reduced first (see rules._ADDITIVE)
    want_x = dict(batch)
    want_w: dict[int, str] = {}
    out = dict(batch)
    if k_axis:
        want_x[last], want_w[1] = k_axis, k_axis
    if n_axis:
        want_w[0] = n_axis
        out[len(out_shape(node)) - 1] = n_axis
    want_b = None if not has_bias else Layout.from_dims({0: n_axis} if n_axis else {})
    return Decision([Layout.from_dims(want_x, kept), Layout.from_dims(want_w), want_b],
                    [Layout.from_dims(out, kept + ([k_axis] if k_axis else []))])


@rule("matmul")
def matmul(node: Node, layouts, sizes) -> Decision:
    a_sh, b_sh = shape_of(node, 0), shape_of(node, 1)
    if len(a_sh) < 2 or len(b_sh) < 2:
        return replicate_all(node, layouts, sizes)
    out_sh = out_shape(node)
    r = len(out_sh)
    batch_shapes = [a_sh[:-2], b_sh[:-2]]
    batch_layouts = [Layout.from_dims({d: a for a, d in lay.splits if d < len(sh)})
                     for lay, sh in zip(layouts, batch_shapes)]
    dims = broadcast_dims(node, batch_layouts, sizes, out_sh[:-2], shapes=batch_shapes)
    used = set(dims.values())
    a_lay, b_lay = layouts
    m_axis, n_axis = a_lay.axis_of(len(a_sh) - 2), b_lay.axis_of(len(b_sh) - 1)
    k_axis = a_lay.axis_of(len(a_sh) - 1) or b_lay.axis_of(len(b_sh) - 2)
    m_axis = m_axis if m_axis not in used and divisible(a_sh[-2], sizes.get(m_axis, 1)) else None
    used.add(m_axis)
    n_axis = n_axis if n_axis not in used and divisible(b_sh[-1], sizes.get(n_axis, 1)) else None
    used.add(n_axis)
    k_axis = k_axis if k_axis not in used and divisible(a_sh[-1], sizes.get(k_axis, 1)) else None
    partial_a: list[str] = []  # partial inputs are reduced first (see rules._ADDITIVE)
    partial_b: list[str] = []
    want_a = want_broadcast(a_sh[:-2], out_sh[:-2], dims).dim_map()
    want_b = want_broadcast(b_sh[:-2], out_sh[:-2], dims).dim_map()
    out = dict(dims)
    partial = partial_a + partial_b
    if m_axis:
        want_a[len(a_sh) - 2] = out[r - 2] = m_axis
    if n_axis:
        want_b[len(b_sh) - 1] = out[r - 1] = n_axis
    if k_axis:
        want_a[len(a_sh) - 1] = want_b[len(b_sh) - 2] = k_axis
        partial.append(k_axis)
    return Decision([Layout.from_dims(want_a, partial_a), Layout.from_dims(want_b, partial_b)],
                    [Layout.from_dims(out, partial)])


@rule("embedding")
def embedding(node: Node, layouts, sizes) -> Decision:
    """Rows split over an axis (vocabulary parallel) give a partial sum: each rank looks up the
    ids in its rows and contributes zeros for the others."""
    w_lay, idx_lay = layouts
    w_sh, idx_sh = shape_of(node, 0), shape_of(node, 1)
    dims = {d: a for a, d in idx_lay.splits if divisible(idx_sh[d], sizes[a])}
    used = set(dims.values())
    want_w: dict[int, str] = {}
    partial = []
    row_axis, col_axis = w_lay.axis_of(0), w_lay.axis_of(1)
    if row_axis and row_axis not in used and divisible(w_sh[0], sizes[row_axis]):
        want_w[0] = row_axis
        partial.append(row_axis)
    elif col_axis and col_axis not in used and divisible(w_sh[1], sizes[col_axis]):
        want_w[1] = col_axis
        dims[len(out_shape(node)) - 1] = col_axis
    return Decision([Layout.from_dims(want_w), Layout.from_dims(
        {d: a for d, a in dims.items() if d < len(idx_sh)})], [Layout.from_dims(dims, partial)])


@rule("scaled_dot_product_attention")
def attention(node: Node, layouts, sizes) -> Decision:
    """Batch and head dims may be split (heads of q, k and v alike; with grouped-query heads a
    contiguous block of query heads reads a contiguous block of KV heads); sequence and head
    size stay whole."""
    q, k, v = (shape_of(node, i) for i in range(3))
    out_sh = out_shape(node)
    lead = len(out_sh) - 2
    dims: dict[int, str] = {}
    for lay in layouts[:3]:
        for axis, d in lay.splits:
            if d < lead and d not in dims and axis not in dims.values() and all(
                    divisible(s[d], sizes[axis]) for s in (q, k, v)):
                dims[d] = axis
    want = [Layout.from_dims(dims) for _ in range(3)]
    mask = node.inputs[3]
    if mask is not None:
        mask_dims = want_broadcast(mask.type.shape, out_sh, dims).dim_map()
        want.append(Layout.from_dims({d: a for d, a in mask_dims.items()
                                      if d < len(mask.type.shape) - 2}))
    else:
        want.append(None)
    return Decision(want, [Layout.from_dims(dims)])


_LINEAR_REDUCTIONS = {"sum", "mean"}


@rule(kinds=("reduction",))
def reduction(node: Node, layouts, sizes) -> Decision:
    rank = len(shape_of(node, 0))
    attrs = node.attrs
    if len(node.outputs) > 1:
        return replicate_all(node, layouts, sizes)
    if "dims" in attrs:
        reduced = {norm_axis(d, rank) for d in attrs["dims"]} if attrs["dims"] else set(range(rank))
        keep = attrs.get("keepdim", False)
    elif "dim" in attrs and attrs["dim"] is not None:
        reduced = {norm_axis(attrs["dim"], rank)}
        keep = attrs.get("keepdim", True) if node.op in ("argmax", "argmin") else True
    else:
        return replicate_all(node, layouts, sizes)
    if node.op in ("softmax", "log_softmax", "cumsum"):
        keep = True
    mapping, shift = {}, 0
    for d in range(rank):
        if d in reduced:
            mapping[d] = None
            shift += 0 if keep else 1
        else:
            mapping[d] = d - shift
    return carry(node, layouts, sizes, mapping, linear=node.op in _LINEAR_REDUCTIONS)


@rule(kinds=("normalization",))
def normalization(node: Node, layouts, sizes) -> Decision:
    """layer_norm and rms_norm normalize the trailing dims, which must be whole; the scale and
    shift weights are whole too."""
    if "normalized_shape" not in node.attrs:
        return replicate_all(node, layouts, sizes)
    rank = len(shape_of(node, 0))
    trailing = len(node.attrs["normalized_shape"])
    decision = carry(node, layouts, sizes, {d: d if d < rank - trailing else None
                                            for d in range(rank)}, linear=False)
    return Decision([decision.want[0]] + [None if v is None else REPLICATED
                                          for v in node.inputs[1:]], decision.out)


@rule("paged_attention")
def paged_attention(node: Node, layouts, sizes) -> Decision:
    """Megatron attention over a paged KV cache: q, k and v split along their features (whole
    heads: the split divides the attention and KV heads), each rank attending with its heads
    over its share of the pool (caches and int8 scales split along the KV-heads dim); the new
    keys and values come out split the same way, for the rank's own pool. Rotary tables and
    slot lists stay whole."""
    axis = next((lay.axis_of(2) for lay in layouts[:3] if lay is not None and lay.axis_of(2)),
                None) or layouts[5].axis_of(1)
    heads, kv_heads = node.attrs["num_heads"], node.attrs["kv_num_heads"]
    if axis is None or heads % sizes[axis] or kv_heads % sizes[axis]:
        return replicate_all(node, layouts, sizes)
    features, by_heads = Layout.from_dims({2: axis}), Layout.from_dims({1: axis})
    want = [features] * 3 + [None if v is None else REPLICATED for v in node.inputs[3:5]] \
        + [by_heads] * 2 + [REPLICATED] * 3 \
        + [None if v is None else by_heads for v in node.inputs[10:]]
    return Decision(want, [features, by_heads, by_heads])
