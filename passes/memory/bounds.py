"""What any plan must reach, and what no reuse costs.

The lower bound is the most bytes live at any one step: buffers live together must be disjoint,
so no placement can use less. (It is not always reachable: fragmentation can force a gap, which
is why planning is a search.) The naive total gives every buffer its own allocation.
"""

from __future__ import annotations

from collections.abc import Sequence

from .lifetimes import Buffer


def live_bytes(buffers: Sequence[Buffer], steps: int) -> list[int]:
    """Bytes reserved by buffers live at each step (a difference array: O(buffers + steps))."""
    delta = [0] * (steps + 1)
    for b in buffers:
        delta[b.first] += b.size
        delta[b.last + 1] -= b.size
    out, total = [], 0
    for step in range(steps):
        total += delta[step]
        out.append(total)
    return out


def lower_bound(buffers: Sequence[Buffer], steps: int) -> int:
    return max(live_bytes(buffers, steps), default=0)


def naive_total(buffers: Sequence[Buffer]) -> int:
    return sum(b.size for b in buffers)
