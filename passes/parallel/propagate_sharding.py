"""GSPMD-style sharding propagation: seed layouts in, every value's layout and the collectives out.

`infer_layouts` is a forward dataflow (compiler/ir/dataflow.py) over the nodes. Graph inputs and
weights start replicated; `shard` nodes (the seeds) set a layout; every other node's rule
(`rules.decide`) keeps what sharding it can and says which operand layouts it needs. Where an
operand has another layout than its user needs, the `propagate_sharding` pass inserts the
conversion (`convert.plan_conversion`): all-reduce, all-gather, reduce-scatter or a local slice.
Graph outputs are made whole (replicated) at the end, so every rank that runs the last stage
holds the complete outputs.

Finally every value that is not replicated gets a `shard` annotation naming its layout, so the IR
text shows the whole placement and the partitioner (`localize`) reads it back without guessing.
The final layouts are the named analysis `sharding` of the graph (`graph.analysis("sharding",
dp=.., tp=..)`), which `--dump-ir` prints after the graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, Value
from compiler.ir.analysis import register_analysis
from compiler.ir.dataflow import forward
from compiler.ir.ops.collective import COMMUNICATION_OPS
from passes.base import Pass, PassResult
from passes.registry import register_pass

from .layout import REPLICATED, Layout
from .layout_conversion import emit_conversion, parse_layout, plan_conversion
from .rules import Decision, decide

_EXPLICIT = {"shard"} | COMMUNICATION_OPS  # ops whose result layout their attributes state
SHARDING = "sharding"  # the named analysis: `graph.analysis("sharding", dp=.., tp=..)`


@dataclass
class Inference:
    """Layouts by value, and every place where an operand needs converting."""

    layouts: dict[Value, Layout] = field(default_factory=dict)
    # (node, operand index, layout it has, layout it needs)
    needs: list[tuple[Node, int, Layout, Layout]] = field(default_factory=list)

    def of(self, value: Value) -> Layout:
        return self.layouts.get(value, REPLICATED)


class _Memo:
    """Rules are pure functions of (node, operand layouts): repeated dry runs reuse decisions."""

    def __init__(self):
        self.table: dict[tuple, Decision] = {}

    def decide(self, node: Node, layouts: list, sizes: Mapping[str, int]) -> Decision:
        key = (id(node), tuple(id(v) for v in node.inputs), tuple(str(x) for x in layouts))
        if key not in self.table:
            self.table[key] = decide(node, layouts, sizes)
        return self.table[key]


def axis_sizes(dp: int = 1, tp: int = 1, ep: int = 1) -> dict[str, int]:
    return {axis: n for axis, n in (("dp", dp), ("tp", tp), ("ep", ep)) if n > 1}


def _replicated(value: Value) -> Layout:
    return REPLICATED  # graph inputs and weights without a seed


def infer_layouts(graph: Graph, sizes: Mapping[str, int],
                  seeds: Mapping[int, Layout] | None = None, memo: _Memo | None = None,
                  stop: Node | None = None) -> Inference:
    """Layouts of every value (a dry run: the graph is not changed), a forward dataflow whose
    transfer is the sharding rule of each node.

    `seeds` overrides the layout of values by id (used to try placements without inserting
    `shard` nodes); `stop` ends the walk before that node.
    """
    memo = memo or _Memo()
    result = Inference()
    if seeds:
        result.layouts.update({v: seeds[id(v)] for v in graph.values() if id(v) in seeds})

    def step(node: Node, layouts: list) -> list[Layout]:
        _check_axes(node, layouts, sizes)
        decision = memo.decide(node, layouts, sizes)
        for i, (have, want) in enumerate(zip(layouts, decision.want)):
            if have is not None and want is not None and have != want:
                result.needs.append((node, i, have, want))
        return decision.out

    forward(graph.nodes, step, _replicated, result.layouts, stop)
    return result


def _describe(graph: Graph, inference: Inference) -> list[str]:
    lines = [f"%{v.name}: {inference.of(v)}" for v in graph.values()
             if not inference.of(v).replicated]
    lines += [f"%{node.outputs[0].name} operand {i} needs {want}, has {have}"
              for node, i, have, want in inference.needs]
    return lines or ["every value replicated"]


@register_analysis(SHARDING, "every value's layout over the mesh, and the conversions needed",
                   _describe)
def sharding(graph: Graph, dp: int = 1, tp: int = 1, ep: int = 1) -> Inference:
    return infer_layouts(graph, axis_sizes(dp, tp, ep))


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
    memo = _Memo()
    layouts: dict[Value, Layout] = {}
    converted: dict[tuple[int, str], Value] = {}

    def step(node: Node, have: list) -> list[Layout]:
        """The forward transfer, converting operands as it goes (conversions are not walked:
        their results' layouts are set here)."""
        _check_axes(node, have, sizes)
        decision = memo.decide(node, have, sizes)
        for i, (value, src, dst) in enumerate(zip(node.inputs, have, decision.want)):
            if value is None or dst is None or src == dst:
                continue
            key = (id(value), str(dst))
            if key not in converted:
                converted[key] = emit_conversion(graph, value, plan_conversion(src, dst), node,
                                                 node.loc)
                layouts[converted[key]] = dst
            graph.set_input(node, i, converted[key])
        return decision.out

    forward(list(graph.nodes), step, _replicated, layouts)
    changed = bool(converted)  # every replaced operand created or reused a conversion
    changed |= _whole_outputs(graph, layouts)
    changed |= _annotate(graph, layouts)
    return changed


def _whole_outputs(graph: Graph, layouts: dict[Value, Layout]) -> bool:
    """Graph outputs made whole; the whole value takes the output's name (callers know the
    output by it) and the shard it was made from becomes `<name>.local`."""
    done: dict[int, Value] = {}
    for i, value in enumerate(graph.outputs):
        if id(value) in done or layouts.get(value, REPLICATED).replicated:
            graph.outputs[i] = done.get(id(value), value)
            continue
        whole = emit_conversion(graph, value, plan_conversion(layouts[value], REPLICATED),
                                None, value.producer.loc if value.producer else None)
        value.name, whole.name = graph.fresh_name(f"{value.name}.local"), value.name
        graph.outputs[i] = done[id(value)] = whole
    return bool(done)


def _annotate(graph: Graph, layouts: dict[Value, Layout]) -> bool:
    """A `shard` node after every non-replicated result that does not state its layout yet."""
    users = graph.users()
    changed = False
    for node in list(graph.nodes):
        if node.op in _EXPLICIT:
            continue
        for value in node.outputs:
            layout = layouts.get(value, REPLICATED)
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

    Needs: a graph whose seeds name mesh axes of the sizes given (`dp`, `tp`, `ep`); inputs and
    weights without a seed are replicated. Guarantees: every operand has the layout its user's
    sharding rule asks for (conversions inserted as all_reduce / all_gather / reduce_scatter in
    global form, or `shard` local slices), graph outputs are replicated, and every non-replicated
    value is annotated. The graph still computes the same function on one device. Exists so
    that tensor and data parallelism come from a few seeds instead of model-specific code.
    """

    name = "propagate_sharding"
    summary = "spread shard annotations through the graph and insert the collectives they need"
    preserves = (SHARDING,)  # computed on the final graph below
    dp: int = 1
    tp: int = 1
    ep: int = 1

    def run(self, graph: Graph) -> PassResult:
        sizes = axis_sizes(self.dp, self.tp, self.ep)
        if not sizes and not any(n.op == "shard" for n in graph.nodes):
            return PassResult(graph, False)
        changed = apply_layouts(graph, sizes)
        options = {"dp": self.dp, "tp": self.tp, **({"ep": self.ep} if self.ep > 1 else {})}
        graph.analysis(SHARDING, **options)  # every value's layout, for --dump-ir
        return PassResult(graph, changed)
