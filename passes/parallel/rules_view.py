"""Sharding rules for views and data movement: a split dim follows the dim it becomes.

These are linear (padding with zeros included), so partial sums pass through them unchanged;
`expand` is the exception, since reducing after it would move more bytes than before it.
"""

from __future__ import annotations

import sympy

from compiler.ir import Node
from compiler.ir.ops.shape_rules import norm_axis
from compiler.ir.symbolic import Dim, equal, normalize

from .layout import REPLICATED, Layout, divisible
from .rules import Decision, broadcast_dims, carry, out_shape, rule, shape_of, want_broadcast


def reshape_blocks(src: tuple[Dim, ...], dst: tuple[Dim, ...]):
    """Group dims of a reshape into blocks of equal element count: [(src dims, dst dims)].

    None when the grouping cannot be proven (symbolic dims that regroup), so nothing is carried.
    """
    blocks, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        one_in = i < len(src) and src[i] == 1
        one_out = j < len(dst) and dst[j] == 1
        if one_in or one_out:
            blocks.append(([i] if one_in else [], [j] if one_out else []))
            i, j = i + one_in, j + one_out
            continue
        if i >= len(src) or j >= len(dst):
            return None
        bi, bj, pi, pj = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while not equal(pi, pj):
            ratio = sympy.simplify(sympy.sympify(pj) / pi)
            if not ratio.is_number:
                return None
            if ratio > 1 and i < len(src):
                pi, i = normalize(pi * src[i]), i + 1
                bi.append(i - 1)
            elif ratio < 1 and j < len(dst):
                pj, j = normalize(pj * dst[j]), j + 1
                bj.append(j - 1)
            else:
                return None
        blocks.append((bi, bj))
    return blocks


def reshape_mapping(src, dst) -> dict[int, int | None]:
    """In dim -> out dim for splits a reshape can carry: the major (outermost non-1) dim of a
    block maps to the major dim of the block it becomes, since an equal split of either is the
    same contiguous run of elements. Other dims must be whole."""
    mapping: dict[int, int | None] = {d: None for d in range(len(src))}
    for bi, bj in reshape_blocks(src, dst) or []:
        major_in = next((d for d in bi if src[d] != 1), None)
        major_out = next((d for d in bj if dst[d] != 1), None)
        if major_in is not None and major_out is not None:
            mapping[major_in] = major_out
    return mapping


@rule("reshape")
def reshape(node: Node, layouts, sizes) -> Decision:
    return carry(node, layouts, sizes, reshape_mapping(shape_of(node, 0), out_shape(node)))


@rule("permute")
def permute(node: Node, layouts, sizes) -> Decision:
    rank = len(shape_of(node, 0))
    dims = [norm_axis(d, rank) for d in node.attrs["dims"]]
    return carry(node, layouts, sizes, {d: dims.index(d) for d in range(rank)})


@rule("expand")
def expand(node: Node, layouts, sizes) -> Decision:
    src, dst = shape_of(node, 0), out_shape(node)
    lead = len(dst) - len(src)
    return carry(node, layouts, sizes, {d: d + lead if equal(src[d], dst[d + lead]) else None
                                        for d in range(len(src))}, linear=False)


def _whole(node: Node, layouts, sizes, whole: set[int], linear: bool = True) -> Decision:
    """Same rank in and out; the dims in `whole` cannot stay split."""
    rank = len(shape_of(node, 0))
    return carry(node, layouts, sizes, {d: None if d in whole else d for d in range(rank)},
                 linear)


@rule("slice")
def slice_(node: Node, layouts, sizes) -> Decision:
    rank = len(shape_of(node, 0))
    return _whole(node, layouts, sizes, {norm_axis(node.attrs["dim"], rank)})


@rule("select")
def select(node: Node, layouts, sizes) -> Decision:
    rank = len(shape_of(node, 0))
    dim = norm_axis(node.attrs["dim"], rank)
    return carry(node, layouts, sizes,
                 {d: None if d == dim else d - (d > dim) for d in range(rank)})


@rule("flip")
def flip(node: Node, layouts, sizes) -> Decision:
    rank = len(shape_of(node, 0))
    return _whole(node, layouts, sizes, {norm_axis(d, rank) for d in node.attrs["dims"]})


@rule("tril", "triu")
def triangle(node: Node, layouts, sizes) -> Decision:
    rank = len(shape_of(node, 0))
    return _whole(node, layouts, sizes, {rank - 1, rank - 2})


@rule("pad")
def pad(node: Node, layouts, sizes) -> Decision:
    rank = len(shape_of(node, 0))
    pads = node.attrs["pads"]
    padded = {rank - 1 - i for i in range(len(pads) // 2) if pads[2 * i] or pads[2 * i + 1]}
    return _whole(node, layouts, sizes, padded, linear=node.attrs["value"] == 0)


@rule("concat")
def concat(node: Node, layouts, sizes) -> Decision:
    out_sh = out_shape(node)
    dim = norm_axis(node.attrs["dim"], len(out_sh))
    every = all(lay is not None and lay.partial for lay in layouts)
    kept = set.intersection(*(set(lay.partial) for lay in layouts)) if every else set()
    dims = broadcast_dims(node, layouts, sizes, out_sh, skip={dim})
    dims = {d: a for d, a in dims.items() if a not in kept}
    want = [want_broadcast(out_sh, out_sh, dims, tuple(kept)) for _ in node.inputs]
    return Decision(want, [Layout.from_dims(dims, tuple(kept))])


@rule("index_select")
def index_select(node: Node, layouts, sizes) -> Decision:
    x = shape_of(node, 0)
    dim = norm_axis(node.attrs["dim"], len(x))
    index_rank = len(shape_of(node, 1))
    mapping = {d: None if d == dim else (d if d < dim else d - 1 + index_rank)
               for d in range(len(x))}
    decision = carry(node, layouts, sizes, mapping)
    return Decision([decision.want[0], REPLICATED], decision.out)


def _batch_only(node: Node, layouts, sizes) -> Decision:
    """Ops that treat each sample alone (conv, pooling, per-sample norms): dim 0 may stay split."""
    src = layouts[0]
    axis = src.axis_of(0)
    dims = {0: axis} if axis is not None and divisible(out_shape(node)[0], sizes[axis]) else {}
    want = [Layout.from_dims(dims)] + [None if v is None else REPLICATED
                                       for v in node.inputs[1:]]
    return Decision(want, [Layout.from_dims(dims)] + [REPLICATED] * (len(node.outputs) - 1))


rule("conv", "max_pool", "avg_pool", "adaptive_avg_pool", "group_norm",
     "batch_norm")(_batch_only)
