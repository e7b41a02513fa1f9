"""Layout conversions: the collectives (and local slices) that turn one layout into another.

Per mesh axis, from the layout a value has to the one a user needs:

    partial -> replicated      all_reduce
    partial -> split on d      reduce_scatter
    split on d -> replicated   all_gather
    split on d -> split on e   all_gather, then a local slice
    replicated -> split on d   a local slice (no communication: every rank has the whole value)

Collectives come first, one per axis; the local slices of every axis are one `shard` node at the
end. Nothing converts into a partial sum: no rule asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, Value

from .layout import Layout


@dataclass(frozen=True)
class ConversionStep:
    """One collective (or the final local `shard`) of a layout conversion."""

    op: str  # all_reduce | all_gather | reduce_scatter | shard
    axis: str | None = None
    dim: int | None = None
    layout: Layout | None = None  # result layout of this step


def _placement(layout: Layout, axis: str):
    if axis in layout.partial:
        return "P"
    dim = layout.dim_of(axis)
    return "R" if dim is None else dim


def plan_conversion(src: Layout, dst: Layout) -> list[ConversionStep]:
    """Steps from `src` to `dst`; empty when they are the same."""
    steps, current = [], src
    for axis in sorted(src.axes() | dst.axes()):
        have, need = _placement(src, axis), _placement(dst, axis)
        if have == need:
            continue
        if need == "P":
            raise ValueError(f"cannot make a partial sum over {axis} from layout {src}")
        if have == "P":
            if need == "R" or current.axis_of(need) is not None:
                current = current.without(axis)
                steps.append(ConversionStep("all_reduce", axis, None, current))
            else:
                current = current.without(axis).split(axis, need)
                steps.append(ConversionStep("reduce_scatter", axis, need, current))
        elif have != "R":
            current = current.without(axis)
            steps.append(ConversionStep("all_gather", axis, have, current))
    if current != dst:
        steps.append(ConversionStep("shard", None, None, dst))
    return steps


def pre_slice(src: Layout, dst: Layout) -> Layout:
    """What `src` becomes after the communication steps towards `dst`, before local slicing."""
    steps = [s for s in plan_conversion(src, dst) if s.op != "shard"]
    return steps[-1].layout if steps else src


def explicit_layouts(node: Node, src: Layout) -> tuple[Layout, Layout]:
    """(operand layout needed, result layout) of a shard node or a global-form collective."""
    if node.op == "shard":
        dst = parse_layout(node)
        return pre_slice(src, dst), dst
    axis, dim = node.attrs["axis"], node.attrs.get("dim")
    ok = {"all_reduce": axis in src.partial, "reduce_scatter": axis in src.partial,
          "all_gather": src.dim_of(axis) == dim}[node.op]
    if not ok:
        raise DayzeroError(f"{node.op} over '{axis}' gets a value of layout {src}, which it "
                           "cannot take", f"node {node.outputs[0].name}" +
                           (f" from {node.loc}" if node.loc else ""),
                           "remove the collective and let propagate_sharding insert it")
    out = src.without(axis)
    if node.op == "reduce_scatter":
        out = out.split(axis, dim)
    return src, out


def parse_layout(node: Node) -> Layout:
    try:
        return Layout.parse(node.attrs["layout"])
    except ValueError as exc:
        raise DayzeroError(f"bad layout on shard node %{node.outputs[0].name}: {exc}",
                           node.loc, "write e.g. layout=\"tp:S0\"") from None


def emit_conversion(graph: Graph, value: Value, steps: list[ConversionStep], before: Node | None,
                    loc: str | None) -> Value:
    """Insert the nodes of `steps` before `before` (at the end if None); returns the result."""
    for step in steps:
        if step.op == "shard":
            attrs = {"layout": str(step.layout)}
        elif step.op == "all_reduce":
            attrs = {"axis": step.axis}
        else:
            attrs = {"axis": step.axis, "dim": step.dim}
        node = graph.add_node(step.op, [value], attrs, loc=loc, before=before,
                              names=[f"{value.name}.{_suffix(step)}"])
        value = node.output
    return value


def _suffix(step: ConversionStep) -> str:
    return {"shard": "shard", "all_reduce": "ar", "all_gather": "ag",
            "reduce_scatter": "rs"}[step.op]
