"""Pipeline parallelism: cut the graph into stages balanced by the cost model, wire the cuts.

Stages are contiguous runs of the graph's (topological) node order. `plan_stages` picks the cut
points that minimize the most expensive stage, counting what a stage must receive (dynamic
programming over the prefix sums of `cost.node_cost`). `cut` then turns one rank's local program
into its stage: the nodes of its stage, a `recv` for each value an earlier stage produces, and a
`send` for each value a later stage reads, paired up by tag. Cheap nodes that need nothing but
the graph inputs (constants, position ids, rotary tables, causal masks) are recomputed by every
stage that reads them instead of being sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.errors import DayzeroError
from compiler.ir import Graph, Value, get_op
from compiler.ir.ops.collective import COMMUNICATION_OPS

from .cost import NETWORK_RATIO, NodeCost, nbytes, node_cost, planning_sizes
from .localize import Local
from .mesh import Mesh

KEY = "parallel.pipeline_parallel"
_SMALL_WEIGHT = 4096  # elements: weights small enough to copy into every stage that reads them
_HEAVY = {"matmul", "attention", "convolution", "fused"}  # never worth computing twice


@dataclass(frozen=True)
class Stage:
    index: int
    start: int  # first node (index into the global graph's nodes)
    end: int  # one past the last node
    flops: int
    weight_bytes: int
    recv_bytes: int
    cost: float

    def to_dict(self) -> dict:
        return {"stage": self.index, "nodes": [self.start, self.end], "flops": self.flops,
                "weight_bytes": self.weight_bytes, "recv_bytes": self.recv_bytes,
                "cost": round(self.cost, 1)}


@dataclass(frozen=True)
class Transfer:
    value: Value  # the global value
    src: int  # producing stage
    dst: int  # reading stage
    tag: int


def recomputable(graph: Graph) -> set[int]:
    """Indices of nodes cheap to repeat in every stage: no communication, no contraction, and
    only graph inputs (every rank has them), small weights and other such nodes as operands."""
    ok_values: set[int] = {id(v) for v in graph.inputs}
    ok_nodes = set()
    for index, node in enumerate(graph.nodes):
        fine = node.op not in COMMUNICATION_OPS and get_op(node.op).kind not in _HEAVY and all(
            v is None or id(v) in ok_values or (graph.is_weight(v) and _small(v))
            for v in node.inputs)
        if fine:
            ok_nodes.add(index)
            ok_values.update(id(v) for v in node.outputs)
    return ok_nodes


def _small(value: Value) -> bool:
    count = 1
    for d in value.type.shape:
        if not isinstance(d, int):
            return False
        count *= d
    return count <= _SMALL_WEIGHT


def _crossing(graph: Graph, sizes, skip: set[int]) -> np.ndarray:
    """crossing[j]: bytes of values made before node j and read at or after it."""
    n = len(graph.nodes)
    last: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v is not None and v.producer is not None:
                last[id(v)] = i
    for v in graph.outputs:
        last[id(v)] = n
    diff = np.zeros(n + 2)
    for i, node in enumerate(graph.nodes):
        if i in skip:
            continue
        for v in node.outputs:
            if last.get(id(v), i) > i:
                diff[i + 1] += nbytes(v, sizes)
                diff[last[id(v)] + 1] -= nbytes(v, sizes)
    return np.cumsum(diff)[: n + 1]


def plan_stages(graph: Graph, pp: int) -> list[Stage]:
    """`pp` contiguous stages minimizing the largest stage cost (receiving included)."""
    n = len(graph.nodes)
    if pp > n:
        raise DayzeroError(f"config key '{KEY}' = {pp} is more stages than the graph has nodes "
                           f"({n})", "parallel config", f"lower {KEY}")
    sizes = planning_sizes(graph)
    costs = [node_cost(graph, node, sizes) for node in graph.nodes]
    prefix = np.concatenate([[0.0], np.cumsum([c.cost for c in costs])])
    crossing = _crossing(graph, sizes, recomputable(graph))
    recv_cost = crossing * NETWORK_RATIO
    best = prefix.copy()  # best[i]: one stage over nodes [0, i)
    choices = []
    for k in range(2, pp + 1):
        new = np.full(n + 1, np.inf)
        arg = np.zeros(n + 1, dtype=np.int64)
        for i in range(k, n + 1):
            j = np.arange(k - 1, i)
            vals = np.maximum(best[j], prefix[i] - prefix[j] + recv_cost[j])
            pick = int(np.argmin(vals))
            new[i], arg[i] = vals[pick], j[pick]
        choices.append(arg)
        best = new
    bounds = [n]
    for arg in reversed(choices):
        bounds.append(int(arg[bounds[-1]]))
    bounds = [0] + bounds[::-1]
    return [_stage(s, bounds[s], bounds[s + 1], costs, crossing, s > 0)
            for s in range(pp)]


def _stage(index: int, start: int, end: int, costs: list[NodeCost], crossing, receives: bool):
    part = costs[start:end]
    recv = int(crossing[start]) if receives else 0
    return Stage(index, start, end, sum(c.flops for c in part),
                 sum(c.weight_bytes for c in part), recv,
                 sum(c.cost for c in part) + recv * NETWORK_RATIO)


def stage_of(stages: list[Stage]) -> list[int]:
    return [s.index for s in stages for _ in range(s.start, s.end)]


def transfers(graph: Graph, stages: list[Stage]) -> list[Transfer]:
    """Every (value, producing stage, reading stage), tagged in one global order."""
    where = stage_of(stages)
    skip = recomputable(graph)
    produced = {id(v): i for i, node in enumerate(graph.nodes) for v in node.outputs}
    pairs: dict[tuple[int, int, int], Value] = {}
    readers = [(where[i], v) for i, node in enumerate(graph.nodes) for v in node.inputs
               if v is not None]
    readers += [(len(stages) - 1, v) for v in graph.outputs]
    for dst, v in readers:
        p = produced.get(id(v))
        if p is None or p in skip or where[p] >= dst:
            continue
        pairs[(where[p], dst, p)] = v
    return [Transfer(v, src, dst, tag)
            for tag, ((src, dst, _), v) in enumerate(sorted(pairs.items(), key=lambda kv: kv[0]))]


def cut(local: Local, graph: Graph, stages: list[Stage], moves: list[Transfer], mesh: Mesh,
        rank: int) -> Graph:
    """Turn `local` (one rank's whole program) into the program of its pipeline stage."""
    g = local.graph
    if len(stages) == 1:
        return g
    coords = mesh.coords(rank)
    stage, last = coords["pp"], len(stages) - 1
    where = stage_of(stages)
    skip = recomputable(graph)
    mine = [n for n in g.nodes if where[local.origin[id(n)]] == stage]
    outputs = g.outputs if stage == last else []
    mine = _with_recomputed(g, mine, outputs, {id(n) for n in g.nodes
                                               if local.origin[id(n)] in skip})
    received: dict[int, Value] = {}
    recvs = []
    for move in sorted((m for m in moves if m.dst == stage), key=lambda m: (m.src, m.tag)):
        lv = local.env[id(move.value)]
        peer = mesh.rank(**{**coords, "pp": move.src})
        node = g.add_node("recv", [], {"shape": list(lv.type.shape), "dtype": lv.type.dtype,
                                       "peer": peer, "tag": move.tag},
                          loc=lv.producer.loc if lv.producer else None, names=[f"{lv.name}.recv"])
        recvs.append(node)
        received[id(lv)] = node.output
    for node in mine:
        for i, v in enumerate(node.inputs):
            if v is not None and id(v) in received:
                g.set_input(node, i, received[id(v)])
    sends = []
    for move in sorted((m for m in moves if m.src == stage), key=lambda m: (m.dst, m.tag)):
        lv = local.env[id(move.value)]
        peer = mesh.rank(**{**coords, "pp": move.dst})
        sends.append(g.add_node("send", [lv], {"peer": peer, "tag": move.tag},
                                loc=lv.producer.loc if lv.producer else None,
                                names=[f"{lv.name}.sent"]))
    g.nodes = recvs + mine + sends
    g.outputs = [received.get(id(v), v) for v in g.outputs] if stage == last else []
    g.remove_unused_weights()
    return g


def _with_recomputed(g: Graph, mine: list, outputs: list, recomputed: set[int]) -> list:
    """`mine` plus the recomputable nodes of other stages that it (or `outputs`) reads."""
    chosen = {id(n) for n in mine}
    wanted = [v for n in mine for v in n.inputs if v is not None] + list(outputs)
    while wanted:
        producer = wanted.pop().producer
        if producer is not None and id(producer) in recomputed and id(producer) not in chosen:
            chosen.add(id(producer))
            wanted.extend(v for v in producer.inputs if v is not None)
    return [n for n in g.nodes if id(n) in chosen]


def stage_report(stages: list[Stage]) -> dict:
    """Each stage's cost and the imbalance: slowest stage over the mean, minus one."""
    costs = [s.cost for s in stages]
    mean = sum(costs) / len(costs) if costs else 0.0
    imbalance = (max(costs) / mean - 1.0) if mean else 0.0
    return {"stages": [s.to_dict() for s in stages], "imbalance": round(imbalance, 4)}
