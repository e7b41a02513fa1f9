"""The memory plan in words: peak, bounds and their ratios, and what is live at the peak.

This is what `dayzero inspect --memory` prints; it reads only the plan and, for value types and
node names, the graph the plan was made for.
"""

from __future__ import annotations

from compiler.ir import Graph, Value

from .plan import MemoryPlan
from .sizes import format_sizes

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: int) -> str:
    size, unit = float(n), 0
    while size >= 1024 and unit < len(_UNITS) - 1:
        size, unit = size / 1024, unit + 1
    return f"{n} B" if unit == 0 else f"{size:.2f} {_UNITS[unit]}"


def ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "n/a"


def summarize(plan: MemoryPlan, graph: Graph | None = None, recorded: bool = True,
              top: int = 10) -> str:
    """A human-readable report of `plan`: totals and ratios, then the largest values at peak."""
    views = sum(a.kind == "view" for a in plan.aliases)
    sized = format_sizes(plan.sizes).replace(";", ", ").replace(":", "=") or "static shapes"
    tried = ", ".join(f"{name} {human_bytes(peak)}" for name, peak in plan.candidates.items())
    lines = [
        "memory plan " + ("(recorded in the artifact)" if recorded
                          else "(not recorded; computed now with default options)"),
        f"  sized for {sized}; alignment {plan.alignment} B; in-place reuse "
        f"{'on' if plan.inplace else 'off'}",
        f"  planner {plan.algorithm} (tried: {tried})",
        f"  plan peak (arena) {human_bytes(plan.arena_bytes):>12}  ({plan.arena_bytes} B)",
        f"  lower bound       {human_bytes(plan.lower_bound):>12}  ({plan.lower_bound} B)   "
        f"peak / lower bound = {ratio(plan.arena_bytes, plan.lower_bound)}",
        f"  naive total       {human_bytes(plan.naive_total):>12}  ({plan.naive_total} B)   "
        f"peak / naive total = {ratio(plan.arena_bytes, plan.naive_total)}",
        f"  {len(plan.buffers)} buffers; {len(plan.aliases)} values share one ({views} views, "
        f"{len(plan.aliases) - views} in place); {len(plan.external)} outside the arena "
        "(graph outputs; views of inputs, weights, outputs)",
    ]
    if not plan.buffers:
        return "\n".join(lines) + "\n"
    step = plan.peak_step()
    node = graph.nodes[step] if graph is not None and step < len(graph.nodes) else None
    at = f": {', '.join('%' + v.name for v in node.outputs)} = {node.op}" if node else ""
    loc = f"  at {node.loc}" if node is not None and node.loc else ""
    lines.append(f"  peak at step {step} of {plan.steps}{at}{loc}")
    lines.append(f"largest values live at step {step}:")
    lines.extend(_peak_table(plan, graph, step, top))
    return "\n".join(lines) + "\n"


def _peak_table(plan: MemoryPlan, graph: Graph | None, step: int, top: int) -> list[str]:
    types = _types(graph)
    members = plan.members()
    live = plan.live_at(step)
    rows = [("value", "type", "bytes", "offset", "steps", "shared with")]
    for b in live[:top]:
        shared = ", ".join("%" + v for v in members.get(b.value, [])[1:4])
        extra = len(members.get(b.value, [])) - 4
        shared += f", +{extra} more" if extra > 0 else ""
        rows.append(("%" + b.value, types.get(b.value, "?"), human_bytes(b.nbytes),
                     str(b.offset), f"{b.first}..{b.last}", shared))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
           for r in rows]
    if len(live) > top:
        out.append(f"  ... and {len(live) - top} smaller buffers")
    return [line.rstrip() for line in out]


def _types(graph: Graph | None) -> dict[str, str]:
    if graph is None:
        return {}
    values: list[Value] = [v for n in graph.nodes for v in n.outputs]
    return {v.name: str(v.type) for v in values}


def describe_plan(graph: Graph, plan: MemoryPlan) -> list[str]:
    """The plan as `--dump-ir` prints it after the graph: totals, then where each value lives."""
    sized = format_sizes(plan.sizes).replace(";", ", ").replace(":", "=") or "static shapes"
    lines = [f"arena {plan.arena_bytes} B (lower bound {plan.lower_bound} B, naive "
             f"{plan.naive_total} B); planner {plan.algorithm}; sized for {sized}; alignment "
             f"{plan.alignment} B; {plan.steps} steps"]
    lines += [f"%{b.value}: offset {b.offset}, {b.size} B, steps {b.first}..{b.last}"
              for b in plan.buffers]
    lines += [f"%{a.value}: {a.kind} of %{a.root} at +{a.offset}" for a in plan.aliases]
    if plan.external:
        lines.append("outside the arena: " + ", ".join("%" + v for v in plan.external))
    return lines
