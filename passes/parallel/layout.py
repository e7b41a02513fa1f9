"""Layouts: how one tensor value is spread over the mesh's data axes.

Per mesh axis a value is either replicated (every rank of the axis holds all of it), split along
one tensor dim (rank i of the axis holds the i-th equal chunk), or a partial sum (the value is the
sum of what the ranks of the axis hold). Axes not mentioned are replicated. The text form, used by
the `shard` op's `layout` attribute, lists the other axes in name order:

    R               replicated everywhere
    tp:S0           split along dim 0 over the tensor-parallel axis
    dp:S0,tp:P      batch split over data parallel, partial sum over tensor parallel
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from compiler.ir.symbolic import Dim, normalize

_ENTRY = re.compile(r"(?P<axis>[a-z]+):(?:S(?P<dim>\d+)|(?P<partial>P))\Z")


@dataclass(frozen=True)
class Layout:
    splits: tuple[tuple[str, int], ...] = ()  # (axis, dim), sorted by axis
    partial: tuple[str, ...] = ()  # axes the value is a partial sum over, sorted

    def __post_init__(self):
        axes = [a for a, _ in self.splits] + list(self.partial)
        dims = [d for _, d in self.splits]
        if len(set(axes)) != len(axes) or len(set(dims)) != len(dims):
            raise ValueError(f"layout uses an axis or a dim twice: {self.splits} {self.partial}")
        object.__setattr__(self, "splits", tuple(sorted(self.splits)))
        object.__setattr__(self, "partial", tuple(sorted(self.partial)))

    # -- queries ------------------------------------------------------------------------------
    @property
    def replicated(self) -> bool:
        return not self.splits and not self.partial

    def dim_of(self, axis: str) -> int | None:
        return next((d for a, d in self.splits if a == axis), None)

    def axis_of(self, dim: int) -> str | None:
        return next((a for a, d in self.splits if d == dim), None)

    def axes(self) -> set[str]:
        return {a for a, _ in self.splits} | set(self.partial)

    def dim_map(self) -> dict[int, str]:
        return {d: a for a, d in self.splits}

    # -- construction -------------------------------------------------------------------------
    def split(self, axis: str, dim: int) -> Layout:
        return Layout(self.splits + ((axis, dim),), self.partial)

    def without(self, axis: str) -> Layout:
        """This layout with `axis` replicated."""
        return Layout(tuple(s for s in self.splits if s[0] != axis),
                      tuple(a for a in self.partial if a != axis))

    def with_partial(self, axis: str) -> Layout:
        return Layout(self.splits, self.partial + (axis,))

    @classmethod
    def from_dims(cls, dims: Mapping[int, str], partial=()) -> Layout:
        return cls(tuple((a, d) for d, a in dims.items()), tuple(partial))

    # -- shapes -------------------------------------------------------------------------------
    def local_shape(self, shape: tuple[Dim, ...], sizes: Mapping[str, int]) -> tuple[Dim, ...]:
        """The shape each rank holds: split dims divided by their axis size."""
        out = list(shape)
        for axis, dim in self.splits:
            out[dim] = local_size(shape[dim], sizes[axis])
        return tuple(out)

    # -- text ---------------------------------------------------------------------------------
    def __str__(self) -> str:
        entries = [(a, f"{a}:S{d}") for a, d in self.splits]
        entries += [(a, f"{a}:P") for a in self.partial]
        return ",".join(text for _, text in sorted(entries)) or "R"

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Read the text form; raises ValueError saying what a layout looks like."""
        text = text.strip()
        if text == "R":
            return REPLICATED
        splits, partial = [], []
        for item in text.split(","):
            match = _ENTRY.match(item.strip())
            if match is None:
                raise ValueError(f"layout entry {item.strip()!r} is not AXIS:S<dim> or AXIS:P "
                                 "(e.g. \"tp:S0\", \"dp:S0,tp:P\", or \"R\" for replicated)")
            if match["partial"]:
                partial.append(match["axis"])
            else:
                splits.append((match["axis"], int(match["dim"])))
        return cls(tuple(splits), tuple(partial))


REPLICATED = Layout()


def local_size(size: Dim, parts: int) -> Dim:
    """One of `parts` equal chunks of a dim (callers check divisibility first)."""
    if isinstance(size, int):
        return size // parts
    return normalize(size / parts)


def divisible(size: Dim, parts: int) -> bool:
    """Whether a dim splits into `parts` equal chunks at every size it can take.

    Symbolic dims never split: their chunk size would depend on the run-time size.
    """
    size = normalize(size)
    return isinstance(size, int) and size % parts == 0 and size >= parts
