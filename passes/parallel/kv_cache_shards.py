"""A tensor-parallel generation step keeps its KV cache sharded: each rank owns its KV heads.

Partitioning treats graph inputs as whole and makes graph outputs whole. For a generation step
(passes/derive_generation_step/) that would mean every rank receiving the whole cache pool
and slicing out its heads, and gathering every layer's new keys and values to every rank. The
pool is the largest thing a server holds, so instead each rank's pool holds only its KV heads
(the same block tables on every rank): in every rank's program the cache inputs
(`k_cache_<i>`, `v_cache_<i>`, the int8 scales) take the local shard directly, in place of the
slice partitioning put after them, and the new keys and values (`key_<i>`, `value_<i>`) leave
before the all-gather partitioning put in front of them. The logits stay whole.
"""

from __future__ import annotations

import re

from compiler.errors import DayzeroError
from compiler.ir import Graph

CACHE_INPUT = re.compile(r"^[kv]_(cache|scale)_\d+$")
OUTPUT_GATHER = "all_gather"


def keep_cache_local(plan) -> None:
    """Rewrite every rank program of `plan` (a ParallelPlan of a generation step) in place."""
    for program in plan.ranks:
        _local_inputs(program.graph)
        _local_outputs(program.graph)


def _local_inputs(graph: Graph) -> None:
    for index, value in enumerate(graph.inputs):
        if not CACHE_INPUT.match(value.name):
            continue
        users = value.users
        if len(users) != 1 or users[0].op != "slice" or users[0].attrs.get("dim") != 1:
            raise DayzeroError(f"cache input {value.name} of {graph.name} is not sharded by "
                               "KV heads", "parallel.tensor_parallel",
                               "this is a bug in the paged_attention sharding rule; report it")
        cut = users[0]
        local = cut.outputs[0]
        value.type = local.type
        graph.replace_uses(local, value)
        graph.remove_nodes([cut])
        graph.inputs[index] = value
    graph.version += 1


def _local_outputs(graph: Graph) -> None:
    for index, value in enumerate(graph.outputs[1:], start=1):
        node = value.producer
        if node is None or node.op != OUTPUT_GATHER:
            continue
        graph.outputs[index] = node.inputs[0]
        if not value.users and value not in graph.outputs:
            graph.remove_nodes([node])
    graph.version += 1
