"""Memory planning: lifetimes of intermediates, offsets in one arena, bounds, verification.

`plan_graph(graph)` is the one call most users need: it analyses lifetimes over the graph's
execution order, runs the planner suite, verifies the winner and returns a `MemoryPlan`. The
`plan_memory` pass records that plan in the artifact; `schedule_for_memory` reorders nodes first
to lower the peak.
"""

from .bounds import live_bytes, lower_bound, naive_total
from .lifetimes import VIEW_ALIASES, Buffer, Lifetimes, analyze_lifetimes, view_alias
from .plan import Alias, MemoryPlan, Placement
from .planners import ALGORITHMS, conflicts, place, plan_buffers, plan_graph
from .schedule import memory_schedule
from .sizes import DEFAULT_ALIGNMENT, SizeEnv, format_sizes, parse_sizes, symbol_values
from .verify import verify_plan

__all__ = ["ALGORITHMS", "Alias", "Buffer", "DEFAULT_ALIGNMENT", "Lifetimes", "MemoryPlan",
           "Placement", "SizeEnv", "VIEW_ALIASES", "analyze_lifetimes", "conflicts",
           "format_sizes", "live_bytes", "lower_bound", "memory_schedule", "naive_total",
           "parse_sizes", "place", "plan_buffers", "plan_graph", "symbol_values", "verify_plan",
           "view_alias"]
