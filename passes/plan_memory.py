"""plan_memory: plan every intermediate's place in one arena, and record the plan in the artifact.

The plan is a pure function of (graph, this pass's options), so it is the named analysis
`memory_plan` (compiler/ir/analysis.py), cached on the graph until the graph changes: `run`
computes and verifies it (so a graph that cannot be planned fails here, with the pass manager's
reproducer; `--dump-ir` prints it after the graph), and the compile driver calls
`memory_plan_for(pipeline, graph)` on the final graph to store it in the artifact's manifest under
`memory_plan` (see passes/memory/plan.py for the schema): the cached plan when nothing changed the
graph since, a fresh one otherwise. The plan is recorded whatever the backend; the reference
backend runs with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from compiler.errors import DayzeroError
from compiler.ir import Graph
from compiler.ir.analysis import register_analysis

from .base import Pass, PassResult
from .memory import ALGORITHMS, DEFAULT_ALIGNMENT, MemoryPlan, parse_sizes, plan_graph
from .memory.report import describe_plan
from .registry import register_pass

MEMORY_PLAN = "memory_plan"


@register_analysis(MEMORY_PLAN, "every intermediate's offset in one arena, verified",
                   describe_plan)
def _memory_plan(graph: Graph, sizes: str = "", alignment: int = DEFAULT_ALIGNMENT,
                 inplace: bool = True, algorithm: str = "all") -> MemoryPlan:
    """The analysis behind the pass: options already checked by `PlanMemory.plan`."""
    algorithms = None if algorithm == "all" else [algorithm]
    return plan_graph(graph, parse_sizes(sizes), alignment, inplace, algorithms)


@register_pass
@dataclass(frozen=True)
class PlanMemory(Pass):
    """Compute and verify the arena memory plan of the graph; leaves the graph unchanged.

    Needs: a valid graph whose size symbols have upper bounds, or `sizes` (e.g. `s0:128;s1:16`)
    for those that do not. Options: `alignment` of every offset in bytes; `inplace` lets an
    elementwise result overwrite an operand that dies at its step; `algorithm` is `all` (the
    suite keeps the smallest plan) or one planner name.
    Guarantees: the graph is not modified; the plan places every intermediate so that no two
    values live at the same step overlap (proved by the verifier), at the graph's current node
    order — so run it after every pass that changes the graph (the driver plans the final graph).
    Why: activation memory is the scarcest resource for large models; one arena sized to a
    near-optimal plan replaces one allocation per intermediate.
    """

    name: ClassVar[str] = "plan_memory"
    summary: ClassVar[str] = "plan every intermediate's offset in one arena (recorded in artifact)"

    sizes: str = ""
    alignment: int = DEFAULT_ALIGNMENT
    inplace: bool = True
    algorithm: str = "all"
    require_bounds: bool = False

    def run(self, graph: Graph) -> PassResult:
        if self.plannable(graph):
            self.plan(graph)
        return PassResult(graph, False)

    def plannable(self, graph: Graph) -> bool:
        """False when a size symbol has no upper bound and no `sizes` entry: the default
        pipeline then records no plan (backends allocate as they go) instead of failing;
        `require_bounds=true` makes that an error."""
        unbounded = [name for name, (_, hi) in graph.symbols.items()
                     if hi is None and name not in parse_sizes(self.sizes)]
        if unbounded and self.require_bounds:
            raise DayzeroError(f"size symbol(s) {', '.join(unbounded)} have no upper bound",
                               "pass plan_memory", "give sizes=SYMBOL:VALUE or bound the Dim")
        return not unbounded

    def plan(self, graph: Graph) -> MemoryPlan:
        """The verified plan for `graph` in its current node order (cached on the graph)."""
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise DayzeroError(f"plan_memory alignment {self.alignment} is not a power of two",
                               "pass plan_memory", "use e.g. alignment=64")
        if self.algorithm != "all" and self.algorithm not in ALGORITHMS:
            raise DayzeroError(f"plan_memory has no algorithm '{self.algorithm}'",
                               "pass plan_memory", "use all or one of: " + ", ".join(ALGORITHMS))
        return graph.analysis(MEMORY_PLAN, sizes=self.sizes, alignment=self.alignment,
                              inplace=self.inplace, algorithm=self.algorithm)


def memory_plan_for(passes: Sequence[Pass], graph: Graph) -> dict[str, Any] | None:
    """The JSON plan to record for the final `graph` if the pipeline plans memory, else None.

    Uses the options of the last `plan_memory` in the pipeline; the plan that pass computed is
    reused when the graph has not changed since.
    """
    planners = [p for p in passes if isinstance(p, PlanMemory)]
    if not planners or not planners[-1].plannable(graph):
        return None
    return planners[-1].plan(graph).to_json()
