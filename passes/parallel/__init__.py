"""Parallel partitioning: tensor, pipeline, data and expert parallelism over one device mesh.

The passes (`shard_tensor_parallel`, `shard_data_parallel`, `shard_expert_parallel`,
`propagate_sharding`) place and spread layouts over the mesh inside one global graph;
`partition` then cuts that graph into pipeline stages and gives every rank its own local graph
and weight shards (docs/parallel.md).
"""

from . import (  # noqa: F401  (registers the passes and the moe sharding rule)
    expert_parallel,
    propagate_sharding,
    shard_data_parallel,
    shard_expert_parallel,
    shard_tensor_parallel,
)
from .layout import REPLICATED, Layout
from .mesh import Mesh
from .partition import ParallelPlan, RankProgram, partition
from .report import communication_report, format_report

__all__ = ["REPLICATED", "Layout", "Mesh", "ParallelPlan", "RankProgram",
           "communication_report", "format_report", "partition"]
