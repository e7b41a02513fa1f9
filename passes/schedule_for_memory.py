"""schedule_for_memory: reorder independent branches so that fewer bytes are live at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compiler.ir import Graph

from .base import Pass, PassResult
from .memory import DEFAULT_ALIGNMENT, memory_schedule, parse_sizes
from .memory.schedule import reorder
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class ScheduleForMemory(Pass):
    """Pick a node order with a lower memory peak; the values computed are unchanged.

    Needs: a valid graph (sizes as for plan_memory: symbols at their upper bounds unless `sizes`
    gives values). Guarantees: the new order is topological, keeps collectives in their relative
    order and has a strictly lower lower bound (max bytes live at one step) than the old one;
    otherwise the graph is left as it was and the pass reports no change.
    Why: torch.export emits nodes in the order the Python code ran, which often starts a branch
    (all of q, k, v; every expert) before finishing the one that would free memory; the arena's
    size is set by the worst step, so the order matters as much as the planner. Run it before
    plan_memory.
    """

    name: ClassVar[str] = "schedule_for_memory"
    summary: ClassVar[str] = "reorder independent nodes to lower peak live memory"

    sizes: str = ""
    alignment: int = DEFAULT_ALIGNMENT

    def run(self, graph: Graph) -> PassResult:
        order = memory_schedule(graph, parse_sizes(self.sizes), self.alignment)
        return PassResult(graph, reorder(graph, order))
