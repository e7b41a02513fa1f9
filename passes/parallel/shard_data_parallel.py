"""Data parallelism: each replica takes an equal slice of the batch (dim 0 of the inputs)."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.errors import DayzeroError
from compiler.ir import Graph
from passes.base import Pass, PassResult
from passes.registry import register_pass

KEY = "parallel.data_parallel"


def place(graph: Graph, dp: int) -> bool:
    """Seed `dp:S0` on every input whose dim 0 is the batch; returns whether any was placed."""
    batched = [v for v in graph.inputs if v.type.rank >= 1]
    if not batched:
        raise DayzeroError(f"config key '{KEY}' = {dp}, but the model has no batched input",
                           "graph inputs", f"set {KEY} to 1")
    batch, first = batched[0].type.shape[0], batched[0]
    if not isinstance(batch, int):
        raise DayzeroError(f"config key '{KEY}' = {dp} needs a static batch size, but dim 0 of "
                           f"input '{first.name}' is {batch}", f"input {first.name}",
                           "export with a fixed batch size that data_parallel divides")
    if batch % dp:
        raise DayzeroError(f"config key '{KEY}' = {dp} does not divide the batch size {batch} "
                           f"(dim 0 of input '{first.name}')", f"input {first.name}",
                           f"export with a batch size that is a multiple of {dp}, or lower {KEY}")
    users = graph.users()
    placed = False
    for value in batched:
        readers = users.get(value, [])
        if value.type.shape[0] != batch or not readers:
            continue
        if all(r.op == "shard" and r.attrs["layout"] == "dp:S0" for r in readers):
            continue
        seed = graph.add_node("shard", [value], {"layout": "dp:S0"}, loc=readers[0].loc,
                              names=[f"{value.name}.dp"], before=readers[0])
        for reader, i in list(value.uses):
            if reader is not seed:
                graph.set_input(reader, i, seed.output)
        placed = True
    return placed


@register_pass
@dataclass(frozen=True)
class ShardDataParallel(Pass):
    """Split the batch of every input over the data-parallel axis (`dp:S0` seeds).

    Needs: inputs whose dim 0 is a static batch size divisible by `size`. Guarantees: a `shard`
    seed on each batched input (propagate_sharding carries it through the model and gathers the
    outputs back whole), or an error naming `parallel.data_parallel` and the numbers. Exists so
    that replicas over the batch come from the config alone.
    """

    name = "shard_data_parallel"
    summary = "split the batch dim of the inputs over data-parallel replicas"
    size: int = 1

    def run(self, graph: Graph) -> PassResult:
        if self.size <= 1:
            return PassResult(graph, False)
        return PassResult(graph, place(graph, self.size))
