"""Planning algorithms and the suite that keeps the smallest plan.

Every algorithm is a plain function with one signature, `(buffers, conflicts) -> offsets`, where
`conflicts[i]` lists the buffers live at some step together with buffer i. They share one
placement rule and differ in the order they place buffers in:

* `greedy_by_size` — largest first, each into the smallest gap that fits among the buffers it
  conflicts with (best fit), else on top of them (TFLite's "greedy by size").
* `greedy_by_breadth` — buffers live at the busiest step first, largest first within it; the
  peak step is packed before anything can fragment it (TFLite / MNN "greedy by breadth").
* `greedy_by_area` — largest size x lifetime first: long-lived buffers settle low, short ones
  fill the gaps they leave.
* `first_fit_by_start` — in execution order, lowest gap that fits (a linear-scan allocator);
  good on chains whose lifetimes nest.
* `search` — a small local search over orders, from the best greedy one: move a buffer that
  ends at the plan's top earlier and place again, within a fixed, seeded budget of tries.

`plan_buffers` runs them in that order (ExecuTorch's `MemoryPlanningAlgorithmSuite`) and keeps the
smallest arena, stopping early once a plan reaches the lower bound, which nothing can beat.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from compiler.ir import Graph

from .bounds import live_bytes, lower_bound, naive_total
from .lifetimes import Buffer, Lifetimes, analyze_lifetimes
from .plan import MemoryPlan, Placement
from .sizes import DEFAULT_ALIGNMENT
from .verify import verify_plan

Algorithm = Callable[[Sequence[Buffer], Sequence[Sequence[int]]], list[int]]


def conflicts(buffers: Sequence[Buffer]) -> list[list[int]]:
    """For each buffer, the (non-empty) buffers whose live steps overlap its own (a sweep)."""
    out: list[list[int]] = [[] for _ in buffers]
    active: list[int] = []
    for i in sorted(range(len(buffers)), key=lambda i: buffers[i].first):
        b = buffers[i]
        if b.size == 0:
            continue
        active = [j for j in active if buffers[j].last >= b.first]
        for j in active:
            out[i].append(j)
            out[j].append(i)
        active.append(i)
    return out


def place(buffers: Sequence[Buffer], order: Sequence[int], conflicts: Sequence[Sequence[int]],
          best_fit: bool = True) -> list[int]:
    """Offsets from placing buffers in `order`, each in a gap among the placed buffers it
    conflicts with: the smallest that fits (`best_fit`) or the lowest, else on top of them."""
    offsets = [-1] * len(buffers)
    sizes = [b.size for b in buffers]
    for i in order:
        size = sizes[i]
        if size == 0:
            offsets[i] = 0
            continue
        taken = sorted((offsets[j], offsets[j] + sizes[j]) for j in conflicts[i] if offsets[j] >= 0)
        chosen, chosen_gap, top = -1, 0, 0
        for start, end in taken:
            gap = start - top
            if gap >= size and (chosen < 0 or gap < chosen_gap):
                chosen, chosen_gap = top, gap
                if not best_fit or gap == size:
                    break
            top = max(top, end)
        offsets[i] = chosen if chosen >= 0 else top
    return offsets


def by_size(buffers: Sequence[Buffer]) -> list[int]:
    return sorted(range(len(buffers)), key=lambda i: (-buffers[i].size, buffers[i].first, i))


def by_breadth(buffers: Sequence[Buffer]) -> list[int]:
    steps = max((b.last for b in buffers), default=-1) + 1
    breadth = np.asarray(live_bytes(buffers, steps), dtype=np.int64)
    keys = []
    for i, b in enumerate(buffers):
        window = breadth[b.first:b.last + 1]
        at = int(np.argmax(window))
        keys.append((-int(window[at]), b.first + at, -b.size, i))
    return [k[-1] for k in sorted(keys)]


def by_area(buffers: Sequence[Buffer]) -> list[int]:
    return sorted(range(len(buffers)), key=lambda i: (
        -buffers[i].size * (buffers[i].last - buffers[i].first + 1), -buffers[i].size, i))


def by_start(buffers: Sequence[Buffer]) -> list[int]:
    return sorted(range(len(buffers)), key=lambda i: (buffers[i].first, -buffers[i].size, i))


def greedy_by_size(buffers: Sequence[Buffer], conflicts: Sequence[Sequence[int]]) -> list[int]:
    return place(buffers, by_size(buffers), conflicts)


def greedy_by_breadth(buffers: Sequence[Buffer], conflicts: Sequence[Sequence[int]]) -> list[int]:
    return place(buffers, by_breadth(buffers), conflicts)


def greedy_by_area(buffers: Sequence[Buffer], conflicts: Sequence[Sequence[int]]) -> list[int]:
    return place(buffers, by_area(buffers), conflicts)


def first_fit_by_start(buffers: Sequence[Buffer],
                       conflicts: Sequence[Sequence[int]]) -> list[int]:
    return place(buffers, by_start(buffers), conflicts, best_fit=False)


# The search's effort: placements it may try, capped so that its total work (placements times
# the size of the conflict table) stays near a fixed budget; a deterministic seed keeps plans
# reproducible across runs and machines.
SEARCH_MAX_TRIES = 400
SEARCH_WORK = 400_000
SEARCH_SEED = 0


def search(buffers: Sequence[Buffer], conflicts: Sequence[Sequence[int]]) -> list[int]:
    """Local search over placement orders from the best greedy order, within a fixed budget
    (`search_tries`), stopping at the lower bound."""
    steps = max((b.last for b in buffers), default=-1) + 1
    return local_search(buffers, conflicts, search_tries(buffers, conflicts),
                        lower_bound(buffers, steps))


def search_tries(buffers: Sequence[Buffer], conflicts: Sequence[Sequence[int]]) -> int:
    """How many orders the search may try: its total work stays near SEARCH_WORK."""
    work = len(buffers) + sum(len(c) for c in conflicts)
    return min(SEARCH_MAX_TRIES, SEARCH_WORK // max(work, 1))


def local_search(buffers: Sequence[Buffer], conflicts: Sequence[Sequence[int]], tries: int,
                 stop_at: int) -> list[int]:
    """Offsets from `tries` rounds of: move a buffer that ends at the plan's top (or one it
    conflicts with) to a random earlier place in the order, place everything again, keep the
    new order if its arena is no larger. Starts from the best of the greedy orders; stops when
    the arena reaches `stop_at`."""
    best_order, best = [], None
    for order in (by_size(buffers), by_breadth(buffers), by_area(buffers)):
        offsets = place(buffers, order, conflicts)
        if best is None or _peak(buffers, offsets) < _peak(buffers, best):
            best_order, best = order, offsets
    rng = random.Random(SEARCH_SEED)
    for _ in range(tries):
        peak = _peak(buffers, best)
        if peak <= stop_at:
            break
        top = [i for i, o in enumerate(best) if o + buffers[i].size == peak]
        moved = rng.choice(top)
        if conflicts[moved] and rng.random() < 0.5:
            moved = rng.choice(conflicts[moved])
        order = [i for i in best_order if i != moved]
        order.insert(rng.randrange(best_order.index(moved) + 1), moved)
        offsets = place(buffers, order, conflicts)
        if _peak(buffers, offsets) <= peak:
            best_order, best = order, offsets
    return best or []


def _peak(buffers: Sequence[Buffer], offsets: Sequence[int]) -> int:
    return max((o + b.size for o, b in zip(offsets, buffers)), default=0)


ALGORITHMS: dict[str, Algorithm] = {
    "greedy_by_size": greedy_by_size,
    "greedy_by_breadth": greedy_by_breadth,
    "greedy_by_area": greedy_by_area,
    "first_fit_by_start": first_fit_by_start,
    "search": search,
}


def plan_buffers(lifetimes: Lifetimes, algorithms: Sequence[str] | None = None,
                 exhaustive: bool = False) -> MemoryPlan:
    """Run the planners (all by default) and keep the smallest arena (the first on ties).

    Unless `exhaustive`, stops at the first plan whose arena equals the lower bound.
    """
    start = time.perf_counter()
    names = list(algorithms or ALGORITHMS)
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown:
        raise ValueError(f"unknown planning algorithm(s) {unknown}; known: {list(ALGORITHMS)}")
    buffers = lifetimes.buffers
    bound = lower_bound(buffers, lifetimes.steps)
    table = conflicts(buffers)
    candidates: dict[str, int] = {}
    best: tuple[int, str, list[int]] | None = None
    for name in names:
        offsets = ALGORITHMS[name](buffers, table)
        peak = _peak(buffers, offsets)
        candidates[name] = peak
        if best is None or peak < best[0]:
            best = (peak, name, offsets)
        if peak == bound and not exhaustive:
            break
    peak, name, offsets = best if best is not None else (0, names[0], [])
    placements = tuple(Placement(b.value, o, b.size, b.nbytes, b.first, b.last)
                       for o, b in zip(offsets, buffers))
    return MemoryPlan(arena_bytes=peak, lower_bound=bound, naive_total=naive_total(buffers),
                      alignment=lifetimes.alignment, sizes=dict(lifetimes.sizes), algorithm=name,
                      candidates=candidates, steps=lifetimes.steps, buffers=placements,
                      aliases=lifetimes.aliases, external=lifetimes.external,
                      inplace=lifetimes.inplace,
                      seconds=time.perf_counter() - start)


def plan_graph(graph: Graph, sizes: Mapping[str, int] | None = None,
               alignment: int = DEFAULT_ALIGNMENT, inplace: bool = True,
               algorithms: Sequence[str] | None = None, exhaustive: bool = False) -> MemoryPlan:
    """Lifetimes, the planner suite and the verifier in one call: a verified plan for `graph`."""
    start = time.perf_counter()
    lifetimes = analyze_lifetimes(graph, sizes, alignment, inplace)
    plan = plan_buffers(lifetimes, algorithms, exhaustive)
    verify_plan(plan, lifetimes)
    return replace(plan, seconds=time.perf_counter() - start)
