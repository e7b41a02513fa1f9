"""Load-time proof that an artifact's memory plan is sound for its graph.

The plan (`memory_plan` in the manifest) tells an executor where every intermediate lives in one
arena. The manifest is not covered by a hash (it holds the hashes), so an edited plan is only
caught by checking it: a buffer moved onto a live one gives silently wrong outputs, `alignment: 0`
divides by zero. This check trusts nothing the plan says about time: it recomputes every buffer's
live steps from graph.dzir (a buffer is live from the step whose node writes its root value
through the last step that reads the root or any value the plan stores in it), and then proves

- every node output is placed exactly once (own buffer, inside another buffer, or outside),
- every buffer is aligned, inside the arena, and reserves what its value needs at the plan's sizes
  (no more than that rounded up to the alignment, so an edit cannot inflate the arena), and every
  value stored inside another's buffer fits in it at its offset,
- no two buffers that are live at the same step share a byte.

The last check sweeps the steps in order keeping the live buffers in a max segment tree over
their offsets: each new buffer asks for the live buffer that starts inside it and for the end of
the live one starting before it. O(n log n) in buffers, for graphs with tens of thousands of values.
The JSON schema is `passes/memory/plan.py`'s; the runtime reads it without importing the passes.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compiler.errors import ArtifactError
from compiler.ir import Graph
from compiler.ir.symbolic import evaluate

PLAN_FORMAT_VERSION = 1
MAX_ALIGNMENT = 1 << 16
_KINDS = ("view", "inplace")


@dataclass(frozen=True)
class _Buffer:
    value: str
    offset: int
    size: int
    first: int
    last: int

    @property
    def end(self) -> int:
        return self.offset + self.size


def check_memory_plan(plan: Any, graph: Graph, where: str) -> None:
    """Raise ArtifactError (naming `where` and the values involved) unless `plan` is sound."""
    if not isinstance(plan, Mapping):
        _fail(f"the memory plan is {type(plan).__name__}, not an object", where)
    version = plan.get("format_version")
    if version != PLAN_FORMAT_VERSION:
        _fail(f"memory plan format version {version!r} is not supported (this runtime reads "
              f"{PLAN_FORMAT_VERSION})", where)
    arena = _int(plan, "arena_bytes", where, 0)
    alignment = _int(plan, "alignment", where, 1, MAX_ALIGNMENT)
    sizes = _sizes(plan.get("sizes"), graph, where)
    slots, shares, external = _placements(plan, where)
    steps = _steps(graph, slots, shares, external, where)
    buffers = []
    env = _Sizes(sizes)
    for name, (offset, size) in slots.items():
        step, value = steps[name]
        need = env.nbytes(value)
        reserve = -(-need // alignment) * alignment
        if offset % alignment or not need <= size <= reserve or offset + size > arena:
            _fail(f"memory plan slot of %{name} (offset {offset}, {size} bytes) does not fit "
                  f"the {arena}-byte arena as a slot of {need}..{reserve} bytes aligned to "
                  f"{alignment}", where)
        buffers.append(_Buffer(name, offset, size, step, step))
    for name, (root, kind, offset) in shares.items():
        need = env.nbytes(steps[name][1])
        if offset + need > slots[root][1]:
            _fail(f"memory plan puts %{name} ({need} bytes, {kind}) at byte {offset} of the "
                  f"{slots[root][1]}-byte buffer of %{root}: it does not fit", where)
    top = max((b.end for b in buffers), default=0)
    if arena > top:
        _fail(f"the memory plan's arena is {arena} bytes but its buffers end at byte {top}",
              where)
    _check_disjoint(_live_ranges(graph, buffers, shares), where)


def _fail(what: str, where: str) -> None:
    raise ArtifactError(what, where, "the artifact is corrupted or was edited; recompile it")


def _int(plan: Mapping[str, Any], key: str, where: str, lo: int, hi: int | None = None) -> int:
    value = plan.get(key)
    if type(value) is not int or value < lo or (hi is not None and value > hi):
        bounds = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        _fail(f"memory plan {key} is {value!r}, not a whole number {bounds}", where)
    return value


def _sizes(sizes: Any, graph: Graph, where: str) -> dict[str, int]:
    if not isinstance(sizes, Mapping):
        _fail(f"memory plan sizes is {sizes!r}, not an object", where)
    for name, value in sizes.items():
        lo, hi = graph.symbols.get(name, (None, None))
        if lo is None or type(value) is not int or value < lo or (hi is not None and value > hi):
            _fail(f"memory plan size {name}={value!r} is not a value of a symbol of "
                  "graph.dzir inside its range", where)
    return dict(sizes)


def _placements(plan: Mapping[str, Any], where: str):
    """value -> (offset, size); value -> (root, kind, offset); external values. Checks the
    form."""
    slots: dict[str, tuple[int, int]] = {}
    shares: dict[str, tuple[str, str]] = {}
    try:
        for b in plan["buffers"]:
            name, offset, size = b["value"], b["offset"], b["size"]
            if not isinstance(name, str) or type(offset) is not int or type(size) is not int \
                    or offset < 0 or size < 0 or name in slots:
                raise ValueError(f"buffer {b!r}")
            slots[name] = (offset, size)
        for a in plan["aliases"]:
            name, root, kind = a["value"], a["root"], a["kind"]
            if not isinstance(name, str) or name in shares or kind not in _KINDS:
                raise ValueError(f"alias {a!r}")
            if root not in slots:
                _fail(f"memory plan shares %{name} with %{root} as {kind!r}, which has no "
                      "slot", where)
            offset = a["offset"]
            if type(offset) is not int or offset < 0 or (kind == "inplace" and offset):
                raise ValueError(f"alias {a!r}")
            shares[name] = (root, kind, offset)
        external = [v for v in plan["external"] if isinstance(v, str)]
        if len(external) != len(plan["external"]):
            raise ValueError("external")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        _fail(f"the memory plan is malformed ({type(exc).__name__}: {exc})", where)
    return slots, shares, set(external)


def _steps(graph: Graph, slots, shares, external, where: str) -> dict[str, tuple[int, Any]]:
    """Every node output placed exactly once; the step and value of each placed in the arena."""
    roots = {}
    placed = 0
    for step, node in enumerate(graph.nodes):
        for value in node.outputs:
            name = value.name
            if (name in slots) + (name in shares) + (name in external) != 1:
                _fail(f"the memory plan does not place %{name} of graph.dzir exactly once",
                      where)
            placed += 1
            if name in slots or name in shares:
                roots[name] = (step, value)
    if len(slots) + len(shares) + len(external) != placed:
        _fail("the memory plan places values graph.dzir does not have", where)
    return roots


class _Sizes:
    """Bytes of a value's type at the plan's symbol values, each distinct dim evaluated once."""

    def __init__(self, values: Mapping[str, int]):
        self.values, self.dims = values, {}

    def nbytes(self, value) -> int:
        total = value.type.dtype.itemsize
        for dim in value.type.shape:
            if not isinstance(dim, int):
                if dim not in self.dims:
                    try:
                        self.dims[dim] = int(evaluate(dim, self.values))
                    except (KeyError, TypeError, ValueError):  # a symbol without a size
                        raise ArtifactError(f"the memory plan gives no size for dim {dim} of "
                                            f"%{value.name}", "memory plan sizes",
                                            "recompile the model") from None
                dim = self.dims[dim]
            total *= int(dim)
        return total


def _live_ranges(graph: Graph, buffers: list[_Buffer], shares) -> list[_Buffer]:
    """Each buffer with its last step: the last node reading its root or a value stored in it."""
    root_of = {b.value: b.value for b in buffers}
    root_of.update({name: root for name, (root, _, _) in shares.items()})
    last = {b.value: b.first for b in buffers}
    for step, node in enumerate(graph.nodes):
        for value in (*node.inputs, *node.outputs):
            root = root_of.get(value.name) if value is not None else None
            if root is not None and not graph.is_weight(value):
                last[root] = max(last[root], step)
    return [_Buffer(b.value, b.offset, b.size, b.first, last[b.value]) for b in buffers]


def _check_disjoint(buffers: list[_Buffer], where: str) -> None:
    """No two buffers live at a common step overlap in memory (sweep + max segment tree)."""
    buffers = [b for b in buffers if b.size]
    order = sorted(range(len(buffers)), key=lambda i: (buffers[i].offset, i))
    position = {i: p for p, i in enumerate(order)}
    starts = [buffers[i].offset for i in order]
    tree = _MaxTree(len(buffers))
    by_first = sorted(range(len(buffers)), key=lambda i: buffers[i].first)
    by_last = sorted(range(len(buffers)), key=lambda i: buffers[i].last)
    gone = 0
    for i in by_first:
        b = buffers[i]
        while gone < len(by_last) and buffers[by_last[gone]].last < b.first:
            tree.set(position[by_last[gone]], -1)
            gone += 1
        begin = bisect.bisect_left(starts, b.offset)
        end = bisect.bisect_left(starts, b.end)
        inside = tree.argmax(begin, end)        # a live buffer starting inside b
        before = tree.argmax(0, begin)          # the live buffer ending last, starting before b
        for p in (inside, before):
            if p is not None and (p >= begin or tree.value[p + tree.n] > b.offset):
                _overlap(buffers[order[p]], b, where)
        tree.set(position[i], b.end)


def _overlap(a: _Buffer, b: _Buffer, where: str) -> None:
    _fail(f"memory plan buffers of %{a.value} (bytes {a.offset}..{a.end}, live at steps "
          f"{a.first}..{a.last}) and %{b.value} (bytes {b.offset}..{b.end}, steps "
          f"{b.first}..{b.last}) overlap while both are live", where)


class _MaxTree:
    """Max over positions [lo, hi) of the ends stored there (-1 = empty), with its position."""

    def __init__(self, n: int):
        self.n = 1 << max(n - 1, 0).bit_length()  # a power of two: a plain binary tree
        self.value = [-1] * (2 * self.n)

    def set(self, p: int, end: int) -> None:
        p += self.n
        self.value[p] = end
        while p > 1:
            p //= 2
            self.value[p] = max(self.value[2 * p], self.value[2 * p + 1])

    def argmax(self, lo: int, hi: int) -> int | None:
        best, node = -1, None
        lo, hi = lo + self.n, hi + self.n
        while lo < hi:
            if lo & 1:
                if self.value[lo] > best:
                    best, node = self.value[lo], lo
                lo += 1
            if hi & 1:
                hi -= 1
                if self.value[hi] > best:
                    best, node = self.value[hi], hi
            lo //= 2
            hi //= 2
        if node is None:
            return None
        while node < self.n:  # down to the leaf holding the max
            node = 2 * node if self.value[2 * node] == best else 2 * node + 1
        return node - self.n
