"""Sharding rules: for one node, which operand layouts it needs and which layouts it produces.

A rule sees the node (global types and attributes), the layouts its operands have now and the mesh
axis sizes, and returns a `Decision`: the layout each operand must have (propagation inserts the
collective or local slice that converts it) and the layout of each result. Rules keep whatever
sharding they can carry through (the GSPMD idea) and ask for a gather only where the op's math
needs a whole dim: a reduction, normalization or softmax over a split dim, a slice along it.

Rules are looked up by op name, then by op kind; an op with no rule is computed replicated, which
is always correct (its split operands are gathered, partial sums reduced), just not parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from compiler.ir import Node, get_op
from compiler.ir.symbolic import Dim, equal

from .layout import REPLICATED, Layout, divisible
from .layout_conversion import explicit_layouts


@dataclass(frozen=True)
class Decision:
    want: list[Layout | None]  # per operand (None for an absent optional operand)
    out: list[Layout]  # per result


Sizes = Mapping[str, int]  # mesh data axis -> size (only axes larger than one)
Rule = Callable[[Node, list, Sizes], Decision]

RULES: dict[str, Rule] = {}  # op name -> rule
KIND_RULES: dict[str, Rule] = {}  # op kind -> rule, for ops without their own entry


def rule(*ops: str, kinds: tuple[str, ...] = ()) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        for kind in kinds:
            KIND_RULES[kind] = fn
        return fn
    return register


def decide(node: Node, layouts: list[Layout | None], sizes: Sizes) -> Decision:
    """The decision for `node` given its operands' current layouts."""
    fn = RULES.get(node.op) or KIND_RULES.get(get_op(node.op).kind) or replicate_all
    return fn(node, layouts, sizes)


# -- generic rules ----------------------------------------------------------------------------

def replicate_all(node: Node, layouts, sizes) -> Decision:
    """The fallback: whole operands in, whole results out."""
    return Decision([None if v is None else REPLICATED for v in node.inputs],
                    [REPLICATED for _ in node.outputs])


def shape_of(node: Node, index: int) -> tuple[Dim, ...]:
    return node.inputs[index].type.shape


def out_shape(node: Node, index: int = 0) -> tuple[Dim, ...]:
    return node.outputs[index].type.shape


def keep_dims(layout: Layout, mapping: Mapping[int, int | None]) -> dict[int, str]:
    """Out-dim -> axis for the splits of `layout` that `mapping` (in dim -> out dim) carries."""
    out = {}
    for axis, dim in layout.splits:
        target = mapping.get(dim)
        if target is not None:
            out[target] = axis
    return out


def carry(node: Node, layouts, sizes, mapping: Mapping[int, int | None],
          linear: bool = True) -> Decision:
    """A one-operand op that moves dims around: in dim d becomes out dim mapping[d] (or, mapped
    to None, must be whole). `linear` ops keep partial sums (reshape, permute, slice, ...)."""
    src = layouts[0]
    dims = keep_dims(src, mapping)
    out_sh = out_shape(node)
    dims = {d: a for d, a in dims.items() if divisible(out_sh[d], sizes[a])}
    back = {o: i for i, o in mapping.items() if o is not None}
    partial = src.partial if linear else ()
    want_in = Layout.from_dims({back[d]: a for d, a in dims.items()}, partial)
    rest = [None if v is None else REPLICATED for v in node.inputs[1:]]
    return Decision([want_in, *rest], [Layout.from_dims(dims, partial)]
                    + [REPLICATED] * (len(node.outputs) - 1))


# -- broadcasting (elementwise) ---------------------------------------------------------------

# Partial sums stay partial only through adds of partial sums. Ops that are linear in one operand
# (mul, neg, a contraction) could carry them too, but a partial value usually also feeds an op
# that needs it whole (an RMS norm squares the value it then scales), and reducing it once there
# and sharing the result is cheaper than reducing every linear branch separately.
_ADDITIVE = {"add", "sub"}


def _kept_partials(node: Node, layouts) -> set[str]:
    present = [lay for lay in layouts if lay is not None]
    if node.op not in _ADDITIVE or not present:
        return set()
    return set.intersection(*(set(lay.partial) for lay in present))


def broadcast_dims(node: Node, layouts, sizes, out_sh, skip: set[int] = frozenset(),
                   shapes=None) -> dict[int, str]:
    """Out-dim -> axis carried from broadcasting operands (dims in `skip` stay whole)."""
    shapes = shapes or [None if v is None else v.type.shape for v in node.inputs]
    rank = len(out_sh)
    dims: dict[int, str] = {}
    for shape, lay in zip(shapes, layouts):
        if lay is None or shape is None:
            continue
        offset = rank - len(shape)
        for axis, d in lay.splits:
            od = d + offset
            if od in skip or od in dims or axis in dims.values():
                continue
            if equal(shape[d], out_sh[od]) and divisible(out_sh[od], sizes[axis]):
                dims[od] = axis
    return dims


def want_broadcast(shape, out_sh, dims: Mapping[int, str], partial=()) -> Layout:
    """The layout an operand of `shape` needs so that it lines up with out dims `dims`."""
    offset = len(out_sh) - len(shape)
    mine = {od - offset: a for od, a in dims.items()
            if od - offset >= 0 and equal(shape[od - offset], out_sh[od])}
    return Layout.from_dims(mine, partial)


@rule(kinds=("elementwise",))
def elementwise(node: Node, layouts, sizes) -> Decision:
    out_sh = out_shape(node)
    kept = _kept_partials(node, layouts)
    dims = broadcast_dims(node, layouts, sizes, out_sh)
    dims = {d: a for d, a in dims.items() if a not in kept}
    want = []
    for v, lay in zip(node.inputs, layouts):
        if v is None:
            want.append(None)
            continue
        partial = tuple(a for a in lay.partial if a in kept)
        want.append(want_broadcast(v.type.shape, out_sh, dims, partial))
    return Decision(want, [Layout.from_dims(dims, kept)])


@rule(kinds=("creation",))
def creation(node: Node, layouts, sizes) -> Decision:
    return replicate_all(node, layouts, sizes)


@rule("shard", "all_reduce", "all_gather", "reduce_scatter")
def explicit(node: Node, layouts, sizes) -> Decision:
    """Annotations and global-form collectives say their result layout themselves."""
    want, out = explicit_layouts(node, layouts[0])
    return Decision([want], [out])


from . import rules_nn, rules_view  # noqa: E402,F401  (register the op-specific rules)
