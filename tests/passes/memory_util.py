"""Helpers shared by the memory-planning tests: parse IR text, plan it, and always verify."""

from __future__ import annotations

import textwrap

from compiler.ir import Graph, parse_ir, verify
from passes.memory import MemoryPlan, plan_graph, verify_plan


def graph(text: str) -> Graph:
    g = parse_ir(textwrap.dedent(text))
    verify(g)
    return g


def planned(g: Graph, **options) -> MemoryPlan:
    """A plan for `g`, checked by the verifier against the graph (every test goes through it)."""
    plan = plan_graph(g, **options)
    verify_plan(plan, g)
    return plan


def rows(plan: MemoryPlan) -> list[tuple]:
    """(value, offset, size, first, last) per buffer, in the plan's order."""
    return [(b.value, b.offset, b.size, b.first, b.last) for b in plan.buffers]
