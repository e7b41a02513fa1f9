"""Capability-based partitioning: which backend runs each node (ExecuTorch / TVM BYOC style).

The partitioner only tags: every node goes to the preferred backend when its `supports(node)`
says yes, otherwise to the fallback; a node neither runs is an error naming it. Consecutive nodes
(in the graph's topological order) with one tag form a segment, so each segment is a maximal
run of nodes for one backend, and values cross between backends only at segment boundaries.
`subgraph` cuts a segment out as a standalone graph that the fallback backend lowers on its own.
The partition is a pure function of the graph and the two backends' capabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node

from .base import Backend


@dataclass(frozen=True)
class Segment:
    """A maximal run of nodes tagged with one backend, and the values crossing its border."""

    backend: str
    nodes: tuple[str, ...]     # first output name of each node, in order
    inputs: tuple[str, ...]    # graph inputs and node outputs it reads from outside (no weights)
    outputs: tuple[str, ...]   # values it produces that others (or the graph's outputs) read

    def to_json(self) -> dict:
        return {"backend": self.backend, "nodes": list(self.nodes), "inputs": list(self.inputs),
                "outputs": list(self.outputs)}


def assign(graph: Graph, preferred: Backend, fallback: Backend | None) -> list[str]:
    """The backend name of each node of `graph` (in node order)."""
    tags, missing = [], []
    for node in graph.nodes:
        if preferred.supports(node):
            tags.append(preferred.name)
        elif fallback is not None and fallback.supports(node):
            tags.append(fallback.name)
        else:
            tags.append("")
            missing.append(node)
    if missing:
        names = ", ".join(f"%{n.outputs[0].name} = {n.op} ({n.loc or 'unknown location'})"
                          for n in missing[:5])
        backends = preferred.name + (f" or {fallback.name}" if fallback else "")
        raise DayzeroError(f"{len(missing)} node(s) run on neither {backends}: {names}",
                           f"backend {preferred.name}",
                           "choose a fallback backend that covers them (--fallback NAME)")
    return tags


def segments(graph: Graph, tags: Sequence[str]) -> list[Segment]:
    """Maximal runs of equally tagged nodes, with their border values."""
    runs: list[tuple[str, list[Node]]] = []
    for node, tag in zip(graph.nodes, tags):
        if runs and runs[-1][0] == tag:
            runs[-1][1].append(node)
        else:
            runs.append((tag, [node]))
    users = graph.users()
    returned = {id(v) for v in graph.outputs}
    out = []
    for tag, nodes in runs:
        inside = {id(n) for n in nodes}
        produced = {id(v) for n in nodes for v in n.outputs}
        inputs = {v.name: None for n in nodes for v in n.inputs
                  if v is not None and id(v) not in produced and not graph.is_weight(v)}
        outputs = [v.name for n in nodes for v in n.outputs if id(v) in returned
                   or any(id(u) not in inside for u in users.get(v, []))]
        out.append(Segment(tag, tuple(n.outputs[0].name for n in nodes), tuple(inputs),
                           tuple(outputs)))
    return out


def subgraph(graph: Graph, segment: Segment) -> Graph:
    """A standalone graph computing `segment` (its weights keep their names and data)."""
    values = {v.name: v for v in graph.values()}
    wanted = set(segment.nodes)
    sub = Graph(f"{graph.name}_{segment.nodes[0]}")
    sub.symbols = dict(graph.symbols)
    env = {}
    for name in segment.inputs:
        env[name] = sub.add_input(name, values[name].type)
    for node in graph.nodes:
        if node.outputs[0].name not in wanted:
            continue
        args = []
        for v in node.inputs:
            if v is not None and v.name not in env and graph.is_weight(v):
                env[v.name] = sub.add_weight(v.name, v.type, graph.weight_data.get(v.name))
            args.append(None if v is None else env[v.name])
        new = sub.add_node(node.op, args, dict(node.attrs), [v.type for v in node.outputs],
                           node.loc, [v.name for v in node.outputs])
        env.update((v.name, w) for v, w in zip(node.outputs, new.outputs))
    sub.outputs = [env[name] for name in segment.outputs]
    return sub
