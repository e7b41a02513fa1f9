"""A rank's graph as steps: compute segments for the backend, communication ops for the runtime.

Backends compile graphs of compute ops; moving tensors between ranks is the runtime's job
(torch.distributed). So a rank's graph is split at every communication op (all_reduce,
all_gather, reduce_scatter, send, recv): each run of compute nodes between them becomes a
sub-graph the backend lowers and loads like a whole model, and the communication ops run in
between. The writer and the runtime both call `split_steps`, so the segments a backend lowered
at compile time are exactly the ones the runtime loads.

Each segment takes every input of the rank's graph first (so its size symbols are bound from the
same inputs), then the values it reads from earlier steps; it returns the values later steps or
the graph outputs read.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Graph, Node, Value
from compiler.ir.ops.collective import COMMUNICATION_OPS


@dataclass
class RankStep:
    node: Node | None = None  # a communication op, or None for a compute segment
    graph: Graph | None = None  # the compute segment as a graph
    reads: list[Value] | None = None  # values of the rank graph it takes (after the inputs)
    writes: list[Value] | None = None  # values of the rank graph it returns, in output order

    @property
    def is_compute(self) -> bool:
        return self.node is None


def split_steps(graph: Graph) -> list[RankStep]:
    """The rank graph as compute segments and communication ops, in execution order."""
    runs: list[list[Node] | Node] = []
    for node in graph.nodes:
        if node.op in COMMUNICATION_OPS:
            runs.append(node)
        elif runs and isinstance(runs[-1], list):
            runs[-1].append(node)
        else:
            runs.append([node])
    later = _later_reads(graph, runs)
    steps = []
    for index, run in enumerate(runs):
        if isinstance(run, Node):
            steps.append(RankStep(node=run))
        else:
            steps.append(_segment(graph, run, later[index], len(steps)))
    return steps


def _later_reads(graph: Graph, runs) -> list[set[int]]:
    """For each run: ids of values that any later run or the graph outputs read."""
    out: list[set[int]] = []
    seen = {id(v) for v in graph.outputs}
    for run in reversed(runs):
        out.append(set(seen))
        nodes = [run] if isinstance(run, Node) else run
        seen |= {id(v) for n in nodes for v in n.inputs if v is not None}
    return out[::-1]


def _segment(graph: Graph, nodes: list[Node], later: set[int], index: int) -> RankStep:
    inputs = {id(v) for v in graph.inputs}
    made = {id(v) for n in nodes for v in n.outputs}
    reads: dict[int, Value] = {}
    for node in nodes:
        for v in node.inputs:
            if v is not None and id(v) not in made and id(v) not in inputs \
                    and not graph.is_weight(v):
                reads.setdefault(id(v), v)
    writes = [v for n in nodes for v in n.outputs if id(v) in later]
    sub = Graph(f"{graph.name}_seg{index}")
    sub.symbols = dict(graph.symbols)
    for v in graph.inputs:
        sub.add_input(v.name, v.type)
    for v in reads.values():
        sub.add_input(v.name, v.type)
    env = {id(v): s for v, s in zip([*graph.inputs, *reads.values()], sub.inputs)}
    for node in nodes:
        args = []
        for v in node.inputs:
            if v is not None and graph.is_weight(v) and v.name not in sub.weights:
                sub.add_weight(v.name, v.type)
            args.append(None if v is None else sub.weights[v.name] if graph.is_weight(v)
                        else env[id(v)])
        new = sub.add_node(node.op, args, dict(node.attrs), output_types=[
            o.type for o in node.outputs], loc=node.loc, names=[o.name for o in node.outputs])
        env.update({id(o): n for o, n in zip(node.outputs, new.outputs)})
    sub.outputs = [env[id(v)] for v in writes]
    return RankStep(graph=sub, reads=list(reads.values()), writes=writes)
