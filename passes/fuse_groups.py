"""fuse_groups: mark the elementwise/broadcast/reduction ops each generated kernel computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compiler.errors import DayzeroError
from compiler.ir import Graph, get_op

from .base import Pass, PassResult
from .fusion.groups import order_groups, partition
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class FuseGroups(Pass):
    """Partition the remaining elementwise, broadcast and reduction ops into fusion groups.

    Needs: a valid graph, normally after `fuse` (model-level patterns are taken first; what is
    left is what a kernel generator must emit). `fusion_group` attributes present are recomputed.
    Guarantees: members of one group get the same `fusion_group=<id>` attribute (ids 0, 1, ... in
    node order) and are contiguous in the node order, which stays topological; no group depends on
    itself through another group or node (no cycles); every group shares one iteration domain and
    lowers memory traffic by the cost rule in passes/fusion/groups.py (never recomputing more
    than it saves); groups have at most `max_nodes` members. Values are unchanged: the reference
    backend runs a group by its members.
    Why: a kernel per elementwise op writes and rereads every intermediate; the triton backend
    emits one kernel per group instead.
    """

    name: ClassVar[str] = "fuse_groups"
    summary: ClassVar[str] = "group elementwise/broadcast/reduction ops into kernels"

    max_nodes: int = 32

    def __post_init__(self):
        if self.max_nodes < 2:
            raise DayzeroError(f"option 'max_nodes' of pass 'fuse_groups' must be >= 2, got "
                               f"{self.max_nodes}", None, "write e.g. fuse_groups{max_nodes=32}")

    def run(self, graph: Graph) -> PassResult:
        before = [(id(n), n.attrs.get("fusion_group")) for n in graph.nodes]
        for node in graph.nodes:
            if "fusion_group" in node.attrs:
                node.attrs = {k: v for k, v in node.attrs.items() if k != "fusion_group"}
        groups = partition(graph, self.max_nodes)
        graph.nodes = order_groups(graph, groups)
        group_id = {id(n): i for i, nodes in enumerate(groups) for n in nodes}
        numbering: dict[int, int] = {}
        for node in graph.nodes:
            if id(node) in group_id:
                gid = numbering.setdefault(group_id[id(node)], len(numbering))
                node.attrs = get_op(node.op).complete_attrs({**node.attrs, "fusion_group": gid})
        after = [(id(n), n.attrs.get("fusion_group")) for n in graph.nodes]
        return PassResult(graph, before != after)
