"""The plan verifier: proves that no two values live at the same step share a byte.

It trusts nothing the planners computed: it recomputes which buffers are live together with its
own sweep over the steps, checks every pair of those for disjoint byte ranges, and checks that
every placement is aligned and inside the arena. Given the lifetimes (or the graph) it also
checks that the plan covers exactly the buffers the graph needs, with their sizes and live
steps, so a plan made for another graph or order is refused. Aliases must point into a buffer
and fit inside it.
"""

from __future__ import annotations

from collections.abc import Mapping

from compiler.errors import VerificationError
from compiler.ir import Graph

from .lifetimes import Lifetimes, analyze_lifetimes
from .plan import MemoryPlan, Placement


def verify_plan(plan: MemoryPlan, against: Lifetimes | Graph | None = None) -> None:
    """Raise VerificationError naming the offending values if the plan is not sound."""
    for b in plan.buffers:
        _check_placement(plan, b)
    _check_disjoint(plan)
    _check_aliases(plan)
    if isinstance(against, Graph):
        against = analyze_lifetimes(against, plan.sizes, plan.alignment, plan.inplace)
    if against is not None:
        _check_covers(plan, against)


def _check_placement(plan: MemoryPlan, b: Placement) -> None:
    where = f"value %{b.value} (steps {b.first}..{b.last})"
    if b.offset < 0 or b.size < b.nbytes or b.first > b.last or b.first < 0 \
            or b.last >= max(plan.steps, 1):
        raise VerificationError(f"placement of %{b.value} is malformed: offset {b.offset}, "
                                f"size {b.size}, nbytes {b.nbytes}, steps {b.first}..{b.last}",
                                where, "this is a planner bug")
    if b.size and (b.offset % plan.alignment or b.size % plan.alignment):
        raise VerificationError(f"%{b.value} at offset {b.offset} size {b.size} is not aligned "
                                f"to {plan.alignment} bytes", where, "this is a planner bug")
    if b.size and b.end > plan.arena_bytes:
        raise VerificationError(f"%{b.value} ends at byte {b.end}, past the arena "
                                f"({plan.arena_bytes} bytes)", where, "this is a planner bug")


def _check_disjoint(plan: MemoryPlan) -> None:
    active: list[Placement] = []
    for b in sorted((b for b in plan.buffers if b.size), key=lambda b: (b.first, b.offset)):
        active = [a for a in active if a.last >= b.first]
        for a in active:
            if a.offset < b.end and b.offset < a.end:
                raise VerificationError(
                    f"%{a.value} (bytes {a.offset}..{a.end}, steps {a.first}..{a.last}) and "
                    f"%{b.value} (bytes {b.offset}..{b.end}, steps {b.first}..{b.last}) overlap "
                    f"while both are live", f"step {b.first}", "this is a planner bug")
        active.append(b)


def _check_aliases(plan: MemoryPlan) -> None:
    roots: Mapping[str, Placement] = {b.value: b for b in plan.buffers}
    for a in plan.aliases:
        root = roots.get(a.root)
        if root is None:
            raise VerificationError(f"%{a.value} shares the buffer of %{a.root}, which the plan "
                                    "does not place", f"value %{a.value}", "this is a planner bug")
        if a.offset < 0 or a.offset > root.nbytes or a.kind not in ("view", "inplace"):
            raise VerificationError(f"%{a.value} sits at byte {a.offset} of %{a.root} "
                                    f"({root.nbytes} bytes) as a {a.kind!r} alias",
                                    f"value %{a.value}", "this is a planner bug")


def _check_covers(plan: MemoryPlan, lifetimes: Lifetimes) -> None:
    want = {b.value: (b.size, b.nbytes, b.first, b.last) for b in lifetimes.buffers}
    have = {b.value: (b.size, b.nbytes, b.first, b.last) for b in plan.buffers}
    if plan.steps != lifetimes.steps:
        raise VerificationError(f"the plan is for {plan.steps} steps, the graph has "
                                f"{lifetimes.steps}", "memory plan",
                                "plan again after the last pass that changes the graph")
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            raise VerificationError(
                f"the plan places %{name} as (size, nbytes, first, last) = {have.get(name)}, the "
                f"graph needs {want.get(name)}", f"value %{name}",
                "plan again after the last pass that changes the graph")
    if set(lifetimes.aliases) != set(plan.aliases) or \
            set(lifetimes.external) != set(plan.external):
        raise VerificationError("the plan's shared and external values differ from the graph's",
                                "memory plan", "plan again after the last pass that changes "
                                "the graph")
