"""From the annotated global graph to one rank's local program (SPMD partitioning).

Every value becomes the shard this rank holds: split dims are divided by their axis size, reshape
and expand targets follow, global-form collectives get the concrete ranks of this rank's group,
`shard` annotations disappear (or become local slices where a replicated value is split), a
vocabulary-parallel embedding looks up only the ids in this rank's rows, and a `moe` op whose
experts are split becomes its all-to-all dispatch, local experts and combine
(expert_parallel.py). Weights consumed only under one split layout are stored as that slice, so
a rank holds only its own shards.

Each local node's type comes from the op's shape rule on the local operands and is checked
against the layout's local shape, so a wrong rule cannot slip through as a wrong answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, TensorType, Value, format_node
from compiler.ir.symbolic import equal

from .expert_parallel import AXIS as EXPERT_AXIS
from .expert_parallel import expand_moe
from .layout import REPLICATED, Layout, local_size
from .layout_conversion import explicit_layouts, parse_layout, plan_conversion
from .mesh import DATA_AXES, Mesh
from .rules import decide

_SHAPE_ATTRS = {"reshape": "shape", "expand": "shape"}  # attrs that spell the result's shape
# attrs that count heads, for ops whose result is split along its last (heads x size) dim
_HEAD_ATTRS = {"paged_attention": ("num_heads", "kv_num_heads")}


@dataclass
class Local:
    """One rank's program; `origin` maps each local node (by id) to its global node index and
    `env` maps each global value (by id) to the local value that holds its shard."""

    graph: Graph
    origin: dict[int, int] = field(default_factory=dict)
    env: dict[int, Value] = field(default_factory=dict)


class _Localizer:
    def __init__(self, graph: Graph, mesh: Mesh, rank: int):
        self.src, self.mesh, self.rank = graph, mesh, rank
        self.coords = mesh.coords(rank)
        self.sizes = {a: mesh.size(a) for a in DATA_AXES if mesh.size(a) > 1}
        self.out = Graph(graph.name)
        self.out.symbols = dict(graph.symbols)
        self.local = Local(self.out)
        self.layouts: dict[int, Layout] = {}
        self.stored = _stored_layouts(graph)
        self.index = 0

    # -- values -------------------------------------------------------------------------------
    def layout(self, value: Value) -> Layout:
        return self.layouts.get(id(value), REPLICATED)

    def bind(self, value: Value, local: Value, layout: Layout) -> None:
        self.local.env[id(value)] = local
        self.layouts[id(value)] = layout

    def weight(self, value: Value) -> Value:
        """The local weight for a global one, declared on first use (sliced if stored split)."""
        name = value.name
        if name not in self.out.weights:
            layout = self.stored.get(name, REPLICATED)
            data = self.src.weight_data.get(name)
            if data is not None and not layout.replicated:
                data = self.slice_data(data, layout)
            shape = layout.local_shape(value.type.shape, self.sizes)
            self.out.add_weight(name, TensorType(value.type.dtype, shape), data)
        return self.out.weights[name]

    def slice_data(self, data: Any, layout: Layout):
        import torch

        tensor = torch.as_tensor(data)
        for axis, dim in layout.splits:
            chunk = tensor.shape[dim] // self.sizes[axis]
            tensor = tensor.narrow(dim, self.coords[axis] * chunk, chunk)
        return tensor.contiguous().clone()

    def operand(self, value: Value | None) -> Value | None:
        if value is None:
            return None
        if self.src.is_weight(value):
            self.layouts.setdefault(id(value), self.stored.get(value.name, REPLICATED))
            return self.weight(value)
        return self.local.env[id(value)]

    # -- nodes --------------------------------------------------------------------------------
    def add(self, op: str, inputs, attrs: Mapping[str, Any], loc: str | None,
            name: str | None = None) -> Value:
        node = self.out.add_node(op, inputs, attrs, loc=loc, names=[name] if name else None)
        self.local.origin[id(node)] = self.index
        return node.outputs[0]

    def run(self) -> Local:
        for value in self.src.inputs:
            self.bind(value, self.out.add_input(value.name, value.type), REPLICATED)
        for index, node in enumerate(self.src.nodes):
            self.index = index
            self.node(node)
        self.out.outputs = [self.output(v) for v in self.src.outputs]
        return self.local

    def output(self, value: Value) -> Value:
        if not self.layout(value).replicated:
            raise DayzeroError(f"graph output %{value.name} is not whole ({self.layout(value)})",
                               None, "run propagate_sharding before partitioning")
        return self.operand(value)

    def node(self, node: Node) -> None:
        ins = [None if v is None else (self.operand(v), self.layout(v)) for v in node.inputs]
        if node.op == "shard":
            self.shard(node, *ins[0])
        elif node.op in ("all_reduce", "all_gather", "reduce_scatter"):
            self.collective(node, *ins[0])
        else:
            self.compute(node, ins)

    def shard(self, node: Node, local: Value, src: Layout) -> None:
        dst = parse_layout(node)
        steps = plan_conversion(src, dst)
        if any(step.op != "shard" for step in steps):
            raise DayzeroError(f"shard %{node.output.name} needs communication from {src} to "
                               f"{dst}", _where(node), "run propagate_sharding first")
        for axis, dim in dst.splits:
            if src.dim_of(axis) == dim:
                continue
            size = local.type.shape[dim]
            chunk = local_size(size, self.sizes[axis])
            start = self.coords[axis] * chunk
            local = self.add("slice", [local], {"dim": dim, "start": start, "end": start + chunk},
                             node.loc, f"{node.output.name}.{axis}{self.coords[axis]}")
        self.bind(node.output, local, dst)

    def collective(self, node: Node, local: Value, src: Layout) -> None:
        _, dst = explicit_layouts(node, src)
        attrs = dict(node.attrs, ranks=self.mesh.group(self.rank, node.attrs["axis"]))
        self.bind(node.output, self.add(node.op, [local], attrs, node.loc, node.output.name), dst)

    def compute(self, node: Node, ins) -> None:
        have = [None if i is None else i[1] for i in ins]
        decision = decide(node, have, self.sizes)
        if [w for w in decision.want] != have:
            raise DayzeroError(f"{node.op} needs operand layouts {_fmt(decision.want)} but has "
                               f"{_fmt(have)}", _where(node), "run propagate_sharding first")
        locals_ = [None if i is None else i[0] for i in ins]
        if node.op == "embedding" and have[0].axis_of(0) is not None:
            results = [self.vocab_embedding(node, locals_, have[0].axis_of(0))]
        elif node.op == "moe" and any(lay is not None and EXPERT_AXIS in lay.axes()
                                      for lay in have):
            results = [expand_moe(self, node, locals_)]
        else:
            attrs = dict(node.attrs)
            if node.op in _SHAPE_ATTRS:
                attrs[_SHAPE_ATTRS[node.op]] = list(decision.out[0].local_shape(
                    node.output.type.shape, self.sizes))
            axis = decision.out[0].axis_of(node.outputs[0].type.rank - 1)
            for key in _HEAD_ATTRS.get(node.op, ()) if axis else ():
                attrs[key] = attrs[key] // self.sizes[axis]
            new = self.out.add_node(node.op, locals_, attrs, loc=node.loc,
                                    names=[v.name for v in node.outputs])
            self.local.origin[id(new)] = self.index
            results = new.outputs
        for value, local, layout in zip(node.outputs, results, decision.out):
            self.check(node, value, local, layout)
            self.bind(value, local, layout)

    def check(self, node: Node, value: Value, local: Value, layout: Layout) -> None:
        want = layout.local_shape(value.type.shape, self.sizes)
        got = local.type.shape
        if len(want) != len(got) or not all(equal(a, b) for a, b in zip(want, got)):
            raise DayzeroError(f"local shape of %{value.name} is {list(got)}, its layout "
                               f"{layout} needs {list(want)}", _where(node),
                               "this is a bug in a sharding rule; report it with the .dzir text")

    def vocab_embedding(self, node: Node, locals_, axis: str) -> Value:
        """Rows [start, start + rows) live here: look up ids in range, zeros for the others;
        the all-reduce of the partial sums restores every row."""
        table, ids = locals_
        rows = table.type.shape[0]
        start = self.coords[axis] * rows
        name, loc, it = node.output.name, node.loc, ids.type.dtype
        lo = self.add("constant", [], {"value": start, "dtype": it}, loc, f"{name}.lo")
        hi = self.add("constant", [], {"value": start + rows, "dtype": it}, loc, f"{name}.hi")
        zero = self.add("constant", [], {"value": 0, "dtype": it}, loc, f"{name}.zero")
        inside = self.add("logical_and", [self.add("ge", [ids, lo], {}, loc),
                                          self.add("lt", [ids, hi], {}, loc)], {}, loc,
                          f"{name}.mine")
        local_ids = self.add("where", [inside, self.add("sub", [ids, lo], {}, loc), zero], {},
                             loc, f"{name}.ids")
        rows_found = self.add("embedding", [table, local_ids], {}, loc, f"{name}.rows")
        mask = self.add("reshape", [inside], {"shape": list(ids.type.shape) + [1]}, loc)
        fill = self.add("constant", [], {"value": 0.0, "dtype": table.type.dtype}, loc)
        return self.add("where", [mask, rows_found, fill], {}, loc, name)


def _stored_layouts(graph: Graph) -> dict[str, Layout]:
    """Weights read only through `shard` nodes of one split layout are stored as that shard."""
    uses: dict[str, set[Layout]] = {}
    for node in graph.nodes:
        for value in node.inputs:
            if value is not None and graph.is_weight(value):
                layout = parse_layout(node) if node.op == "shard" else REPLICATED
                uses.setdefault(value.name, set()).add(layout)
    return {name: next(iter(layouts)) for name, layouts in uses.items()
            if len(layouts) == 1 and not next(iter(layouts)).partial}


def _fmt(layouts) -> str:
    return "(" + ", ".join("_" if x is None else str(x) for x in layouts) + ")"


def _where(node: Node) -> str:
    return f"node `{format_node(node)}`" + (f" from {node.loc}" if node.loc else "")


def localize(graph: Graph, mesh: Mesh, rank: int) -> Local:
    """The local program of `rank` for a graph annotated by propagate_sharding."""
    return _Localizer(graph, mesh, rank).run()
