"""The whole parallel partitioning, from one graph and a mesh to one program per rank.

1. Place and spread layouts in the global graph with the pass manager (verified after every
   pass, dumped with the rest under `--dump-ir`): `shard_tensor_parallel`, `shard_data_parallel`,
   `shard_expert_parallel` (with `expert_parallel` above 1), `propagate_sharding`.
2. Cut the annotated graph into `pipeline_parallel` stages with the cost model.
3. For every rank: its local program (`localize`), cut down to its stage (`pipeline.cut`).

The result carries what the artifact records: the annotated graph, every rank's graph with its
weight shards, the stage costs and the communication report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.ir import Graph, verify

from .localize import localize
from .mesh import DATA_AXES, Mesh
from .pipeline_stages import Stage, cut, plan_stages, stage_report, transfers
from .report import communication_report


@dataclass
class RankProgram:
    rank: int
    coords: dict[str, int]
    graph: Graph  # local graph with its weight shards in graph.weight_data


@dataclass
class ParallelPlan:
    mesh: Mesh
    graph: Graph  # the annotated global graph
    pipeline: str
    stages: list[Stage]
    ranks: list[RankProgram]

    def communication(self) -> dict[str, Any]:
        return communication_report({r.rank: r.graph for r in self.ranks})

    def manifest(self) -> dict[str, Any]:
        """The `parallel` section of the artifact manifest (the writer adds `ranks`)."""
        groups = {axis: self.mesh.groups(axis) for axis in DATA_AXES if self.mesh.size(axis) > 1}
        return {"world_size": self.mesh.world_size, **self.mesh.to_dict(),
                "mesh_order": ["pp", "dp", "tp"], "groups": groups, "pipeline": self.pipeline,
                **stage_report(self.stages), "communication": self.communication()}


def annotation_pipeline(mesh: Mesh) -> str:
    """Tensor-parallel placement first: its trial propagations see only its own axis."""
    experts = f"shard_expert_parallel{{size={mesh.ep}}}," if mesh.ep > 1 else ""
    spread = f"dp={mesh.dp},tp={mesh.tp}" + (f",ep={mesh.ep}" if mesh.ep > 1 else "")
    return (f"shard_tensor_parallel{{size={mesh.tp}}},shard_data_parallel{{size={mesh.dp}}},"
            f"{experts}propagate_sharding{{{spread}}}")


def partition(graph: Graph, mesh: Mesh, *, dump_dir: str | Path | None = None,
              log: Callable[[str], None] | None = None) -> ParallelPlan:
    """Partition `graph` (with its weight_data) over `mesh`; `graph` is annotated in place."""
    from passes.manager import PassManager

    pipeline = annotation_pipeline(mesh)
    graph = PassManager(pipeline, dump_dir=dump_dir, log=log).run(graph)
    stages = plan_stages(graph, mesh.pp)
    moves = transfers(graph, stages)
    ranks = []
    for rank in range(mesh.world_size):
        local = localize(graph, mesh, rank)
        program = cut(local, graph, stages, moves, mesh, rank)
        program.name = f"{graph.name}_rank{rank}"
        verify(program)
        ranks.append(RankProgram(rank, mesh.coords(rank), program))
    return ParallelPlan(mesh, graph, pipeline, stages, ranks)
