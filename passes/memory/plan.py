"""The memory plan as data: where every intermediate lives in the arena, and its JSON form.

A plan is what a backend needs to run with one arena and what `dayzero inspect --memory` reports:
the arena size, a placement (offset, reserved size, first and last step) for every buffer, the
values that share a buffer (views and in-place results, with their byte offset inside it), and the
values kept out of the arena (graph outputs and views of inputs, weights or outputs). Steps are
node indices in the graph's execution order, so a plan belongs to one graph text.

The JSON form (`to_json`) is stored in the artifact's manifest under `memory_plan`; its schema is
the `MemoryPlan` fields below, with `buffers` and `aliases` as lists of objects. Backends read it
without importing this package (the runtime must not import passes), so the schema only grows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from compiler.errors import DayzeroError

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Placement:
    """One buffer: the value whose node allocates it, where it sits, and when it is live."""

    value: str
    offset: int
    size: int      # bytes reserved: nbytes rounded up to the alignment
    nbytes: int    # bytes the value needs at the planned sizes
    first: int     # step that writes it
    last: int      # last step that reads it or any value sharing it

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class Alias:
    """A value stored inside another value's buffer instead of one of its own.

    `kind` is "view" (a view op whose result is a contiguous part of its source) or "inplace"
    (an elementwise result written over an operand that dies at that step). `offset` is the byte
    offset from the start of `root`'s buffer at the planned sizes.
    """

    value: str
    root: str
    offset: int
    kind: str


@dataclass(frozen=True)
class MemoryPlan:
    arena_bytes: int             # the plan's peak: the one allocation a run needs
    lower_bound: int             # max over steps of the bytes live at that step
    naive_total: int             # every buffer in its own allocation (no reuse)
    alignment: int
    sizes: Mapping[str, int]     # the symbol values the plan was sized for
    algorithm: str               # the planner whose plan was kept
    candidates: Mapping[str, int]  # peak of every planner the suite ran
    steps: int                   # number of nodes in the planned execution order
    buffers: tuple[Placement, ...]
    aliases: tuple[Alias, ...] = ()
    external: tuple[str, ...] = ()  # node outputs that live outside the arena
    inplace: bool = True         # whether elementwise results could reuse a dying operand
    seconds: float = field(default=0.0, compare=False)  # planning time, for reports

    # -- queries ------------------------------------------------------------------------------
    def live_bytes(self) -> list[int]:
        """Bytes reserved by buffers live at each step."""
        delta = [0] * (self.steps + 1)
        for b in self.buffers:
            delta[b.first] += b.size
            delta[b.last + 1] -= b.size
        live, total = [], 0
        for step in range(self.steps):
            total += delta[step]
            live.append(total)
        return live

    def peak_step(self) -> int:
        """The first step at which the most bytes are live (0 for an empty plan)."""
        live = self.live_bytes()
        return live.index(max(live)) if live else 0

    def live_at(self, step: int) -> list[Placement]:
        """Buffers live at `step`, largest first."""
        live = [b for b in self.buffers if b.first <= step <= b.last]
        return sorted(live, key=lambda b: (-b.nbytes, b.offset))

    def members(self) -> dict[str, list[str]]:
        """Root value -> every value stored in its buffer (root first)."""
        out = {b.value: [b.value] for b in self.buffers}
        for a in self.aliases:
            out.setdefault(a.root, [a.root]).append(a.value)
        return out

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "arena_bytes": self.arena_bytes,
            "lower_bound": self.lower_bound,
            "naive_total": self.naive_total,
            "alignment": self.alignment,
            "sizes": dict(sorted(self.sizes.items())),
            "algorithm": self.algorithm,
            "candidates": dict(self.candidates),
            "steps": self.steps,
            "buffers": [asdict(b) for b in self.buffers],
            "aliases": [asdict(a) for a in self.aliases],
            "external": list(self.external),
            "inplace": self.inplace,
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "memory_plan") -> MemoryPlan:
        """Read `to_json` output back; anything malformed is a DayzeroError naming `where`."""
        try:
            if data["format_version"] != FORMAT_VERSION:
                raise DayzeroError(f"memory plan format version {data['format_version']!r} is "
                                   f"not supported (this dayzero reads {FORMAT_VERSION})", where,
                                   "recompile the model with this dayzero")
            return cls(
                arena_bytes=_int(data["arena_bytes"]), lower_bound=_int(data["lower_bound"]),
                naive_total=_int(data["naive_total"]), alignment=_int(data["alignment"]),
                sizes={str(k): _int(v) for k, v in data["sizes"].items()},
                algorithm=str(data["algorithm"]),
                candidates={str(k): _int(v) for k, v in data["candidates"].items()},
                steps=_int(data["steps"]),
                buffers=tuple(Placement(**_fields(b, Placement)) for b in data["buffers"]),
                aliases=tuple(Alias(**_fields(a, Alias)) for a in data["aliases"]),
                external=tuple(str(v) for v in data["external"]),
                inplace=_bool(data["inplace"]))
        except DayzeroError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DayzeroError(f"the memory plan is malformed ({type(exc).__name__}: {exc})",
                               where, "recompile the model") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _fields(data: Mapping[str, Any], kind: type) -> dict[str, Any]:
    names = kind.__dataclass_fields__
    if set(data) != set(names):
        raise KeyError(f"{kind.__name__} needs fields {sorted(names)}, got {sorted(data)}")
    return {k: (str(v) if k in ("value", "root", "kind") else _int(v)) for k, v in data.items()}
