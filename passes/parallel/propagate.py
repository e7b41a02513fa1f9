"""GSPMD-style sharding propagation: seed layouts in, every value's layout and the collectives out.

`infer_layouts` walks the graph in order. Graph inputs and weights start replicated; `shard` nodes
(the seeds) set a layout; every other node's rule (`rules.decide`) keeps what sharding it can and
says which operand layouts it needs. Where an operand has another layout than its user needs, the
`propagate_sharding` pass inserts the conversion (`convert.plan_conversion`): all-reduce,
all-gather, reduce-scatter or a local slice. Graph outputs are made whole (replicated) at the end,
so every rank that runs the last stage holds the complete outputs.

Finally every value that is not replicated gets a `shard` annotation naming its layout, so the IR
text shows the whole placement and the partitioner (`localize`) reads it back without guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, Value
from compiler.ir.ops.collective import COMMUNICATION_OPS
from passes.base import Pass, PassResult
from passes.registry import register_pass

from .convert import emit_conversion, parse_layout, plan_conversion
from .layout import REPLICATED, Layout
from .rules import Decision, decide

_EXPLICIT = {"shard"} | COMMUNICATION_OPS  # ops whose result layout their attributes state


@dataclass
class Inference:
    """Layouts by value id, and every place where an operand needs converting."""

    layouts: dict[int, Layout] = field(default_factory=dict)
    # (node, operand index, layout it has, layout it needs)
    needs: list[tuple[Node, int, Layout, Layout]] = field(default_factory=list)

    def of(self, value: Value) -> Layout:
        return self.layouts.get(id(value), REPLICATED)


class _Memo:
    """Rules are pure functions of (node, operand layouts): repeated dry runs reuse decisions."""

    def __init__(self):
        self.table: dict[tuple, Decision] = {}

    def decide(self, node: Node, layouts: list, sizes: Mapping[str, int]) -> Decision:
        key = (id(node), tuple(id(v) for v in node.inputs), tuple(str(x) for x in layouts))
        if key not in self.table:
            self.table[key] = decide(node, layouts, sizes)
        return self.table[key]


def axis_sizes(dp: int = 1, tp: int = 1) -> dict[str, int]:
    return {axis: n for axis, n in (("dp", dp), ("tp", tp)) if n > 1}


def infer_layouts(graph: Graph, sizes: Mapping[str, int],
                  seeds: Mapping[int, Layout] | None = None, memo: _Memo | None = None,
                  stop: Node | None = None) -> Inference:
    """Layouts of every value (a dry run: the graph is not changed).

    `seeds` overrides the layout of values by id (used to try placements without inserting
    `shard` nodes); `stop` ends the walk before that node.
    """
    memo = memo or _Memo()
    result = Inference()
    result.layouts.update(seeds or {})
    for node in graph.nodes:
        if node is stop:
            break
        layouts = [None if v is None else result.of(v) for v in node.inputs]
        _check_axes(node, layouts, sizes)
        decision = memo.decide(node, layouts, sizes)
        for i, (have, want) in enumerate(zip(layouts, decision.want)):
            if have is not None and want is not None and have != want:
                result.needs.append((node, i, have, want))
        for value, layout in zip(node.outputs, decision.out):
            result.layouts[id(value)] = layout
    return result


def _check_axes(node: Node, layouts, sizes) -> None:
    axes = set().union(*(lay.axes() for lay in layouts if lay is not None)) if layouts else set()
    if node.op == "shard":
        axes |= parse_layout(node).axes()
    unknown = axes - set(sizes)
    if unknown:
        raise DayzeroError(f"layout over mesh axis {sorted(unknown)} but the mesh has "
                           f"{sorted(sizes) or 'no split axes'}",
                           f"node %{node.outputs[0].name}" + (f" from {node.loc}" if node.loc
                                                              else ""),
                           "set parallel.tensor_parallel / data_parallel above 1, or remove "
                           "the shard annotation")


def apply_layouts(graph: Graph, sizes: Mapping[str, int]) -> bool:
    """Insert the conversions and annotations; returns whether the graph changed."""
    changed = False
    memo = _Memo()
    layouts: dict[int, Layout] = {}
    converted: dict[tuple[int, str], Value] = {}
    for node in list(graph.nodes):
        have = [None if v is None else layouts.get(id(v), REPLICATED) for v in node.inputs]
        _check_axes(node, have, sizes)
        decision = memo.decide(node, have, sizes)
        for i, (value, src, dst) in enumerate(zip(node.inputs, have, decision.want)):
            if value is None or dst is None or src == dst:
                continue
            key = (id(value), str(dst))
            if key not in converted:
                converted[key] = emit_conversion(graph, value, plan_conversion(src, dst), node,
                                                 node.loc)
                layouts[id(converted[key])] = dst
            graph.set_input(node, i, converted[key])
            changed = True
        for value, layout in zip(node.outputs, decision.out):
            layouts[id(value)] = layout
    changed |= _whole_outputs(graph, layouts)
    changed |= _annotate(graph, layouts)
    return changed


def _whole_outputs(graph: Graph, layouts: dict[int, Layout]) -> bool:
    """Graph outputs made whole; the whole value takes the output's name (callers know the
    output by it) and the shard it was made from becomes `<name>.local`."""
    done: dict[int, Value] = {}
    for i, value in enumerate(graph.outputs):
        if id(value) in done or layouts.get(id(value), REPLICATED).replicated:
            graph.outputs[i] = done.get(id(value), value)
            continue
        whole = emit_conversion(graph, value, plan_conversion(layouts[id(value)], REPLICATED),
                                None, value.producer.loc if value.producer else None)
        value.name, whole.name = graph.fresh_name(f"{value.name}.local"), value.name
        graph.outputs[i] = done[id(value)] = whole
    return bool(done)


def _annotate(graph: Graph, layouts: dict[int, Layout]) -> bool:
    """A `shard` node after every non-replicated result that does not state its layout yet."""
    users = graph.users()
    changed = False
    for node in list(graph.nodes):
        if node.op in _EXPLICIT:
            continue
        for value in node.outputs:
            layout = layouts.get(id(value), REPLICATED)
            readers = users.get(value, [])
            if layout.replicated or (readers and all(
                    r.op == "shard" and r.attrs["layout"] == str(layout) for r in readers)):
                continue
            index = graph.index(node) + 1
            anchor = graph.nodes[index] if index < len(graph.nodes) else None
            note = graph.add_node("shard", [value], {"layout": str(layout)}, loc=node.loc,
                                  names=[f"{value.name}.shard"], before=anchor)
            for reader, i in list(value.uses):
                if reader is not note:
                    graph.set_input(reader, i, note.output)
            changed = True
    return changed


@register_pass
@dataclass(frozen=True)
class PropagateSharding(Pass):
    """Spread seed layouts (`shard` nodes) to every value and insert the collectives they need.

    Needs: a graph whose seeds name mesh axes of the sizes given (`dp`, `tp`); graph inputs and
    weights without a seed are replicated. Guarantees: every operand has the layout its user's
    sharding rule asks for (conversions inserted as all_reduce / all_gather / reduce_scatter in
    global form, or `shard` local slices), graph outputs are replicated, and every non-replicated
    value is annotated. The graph still computes the same function on one device. Exists so
    that tensor and data parallelism come from a few seeds instead of model-specific code.
    """

    name = "propagate_sharding"
    summary = "spread shard annotations through the graph and insert the collectives they need"
    dp: int = 1
    tp: int = 1

    def run(self, graph: Graph) -> PassResult:
        sizes = axis_sizes(self.dp, self.tp)
        if not sizes and not any(n.op == "shard" for n in graph.nodes):
            return PassResult(graph, False)
        return PassResult(graph, apply_layouts(graph, sizes))
