"""Dynamic shapes torch.export refuses: retry with torch's own suggested fixes.

A model often forces a dynamic dim into a narrower range (`seq >= 2`), a relation (`seq` a
multiple of 2: `seq = 2*_seq`) or a constant (a state-space scan unrolled over the sequence).
torch.export then fails with "Constraints violated (seq)!" and a "Suggested fixes:" block; its
`refine_dynamic_shapes_from_suggested_fixes` turns that block into new dynamic_shapes. Ranges
and relations are retried (a few rounds: one fix can uncover the next), and what was changed is
recorded so the user is told which range was compiled. A dim torch fixes to a constant has no
dynamic graph at all: that is reported as `SpecializedDims`, for the driver to compile a few
static sizes instead (compiler/static_sizes.py).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from compiler.errors import DayzeroError

# Rounds of refinement before giving up (each is a full torch.export trace).
MAX_ROUNDS = 3


@dataclass(frozen=True)
class Refinement:
    """One fix torch suggested and dayzero applied: the Dim's name and torch's line for it."""

    dim: str
    fix: str


class SpecializedDims(DayzeroError):
    """torch.export fixed dynamic dims to constants: no single dynamic graph exists.

    `sizes` maps each such Dim name to the size the example had; `dynamic_shapes` is the
    refined spec (those dims as ints), `refinements` what was applied before."""

    def __init__(self, message: str, where: str, fix: str, sizes: dict[str, int],
                 dynamic_shapes: Any, refinements: list[Refinement]):
        super().__init__(message, where, fix)
        self.sizes = sizes
        self.dynamic_shapes = dynamic_shapes
        self.refinements = refinements


@dataclass
class RefineState:
    """What the retries of one export applied (read by the driver for its log and manifest):
    the fixes, the dynamic_shapes the successful trace ran with (None: the user's), and the
    expert-loop modules traced through transformers' grouped experts (expert_loops.py)."""

    refinements: list[Refinement] = field(default_factory=list)
    dynamic_shapes: Any = None
    grouped_experts: list[str] = field(default_factory=list)


def fix_lines(text: str) -> list[str]:
    """torch's 'Suggested fixes:' lines (up to the first blank line), stripped."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("Suggested fixes"):
            block = []
            for follow in lines[i + 1:]:
                if not follow.strip():
                    break
                block.append(follow.strip())
            return block
    return []


def refine(exc: Exception, dynamic_shapes: Any) -> tuple[Any, list[Refinement]] | None:
    """The dynamic_shapes torch's suggested fixes in `exc` give, and the fixes; None when the
    failure is not a constraint violation with fixes that apply to `dynamic_shapes`."""
    text = str(exc)
    if dynamic_shapes is None or "Constraints violated" not in text:
        return None
    fixes = fix_lines(text)
    if not fixes:
        return None
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    try:
        refined = refine_dynamic_shapes_from_suggested_fixes(
            "Suggested fixes:\n" + "\n".join(fixes), dynamic_shapes)
    except Exception:  # a fix torch's own parser cannot apply: report the original error
        return None
    return (_within(dynamic_shapes, refined),
            [Refinement(line.split(" = ", 1)[0].strip(), line) for line in fixes])


def _within(original: Any, refined: Any) -> Any:
    """`refined` with each range fix kept inside the user's own range: torch writes a fix as
    `Dim('seq', max=24)`, which would drop the user's `min=1` (back to 0)."""
    if isinstance(refined, dict) and isinstance(original, dict):
        return {k: _within(original.get(k), v) for k, v in refined.items()}
    if isinstance(refined, (list, tuple)) and isinstance(original, (list, tuple)) \
            and len(refined) == len(original):
        return type(refined)(_within(o, r) for o, r in zip(original, refined))
    name = getattr(refined, "__name__", None)
    if name is None or getattr(original, "__name__", None) != name \
            or type(refined) is not type(original) or not hasattr(refined, "min"):
        return refined
    from torch.export import Dim

    lo = max(_bound(original.min, 0), _bound(refined.min, 0))
    hi = min(_bound(original.max, None), _bound(refined.max, None),
             key=lambda x: float("inf") if x is None else x)
    return Dim(name, min=lo, max=hi)


def _bound(value: Any, default: int | None) -> int | None:
    """A Dim's bound as an int (torch keeps an unbounded max as a huge sympy integer)."""
    return int(value) if isinstance(value, int) and abs(value) < 2 ** 62 else default


def static_dims(original: Any, refined: Any) -> dict[str, int]:
    """Dims that were dynamic in `original` and are ints in `refined`: {Dim name: size}."""
    found: dict[str, int] = {}
    for before, after in zip(_leaves(original), _leaves(refined)):
        name = getattr(before, "__name__", None)
        if name is not None and isinstance(after, int) and not isinstance(after, bool):
            found[name] = after
    return found


def _leaves(spec: Any) -> list[Any]:
    """The per-axis entries of a dynamic_shapes spec, in a fixed order (dicts by key order)."""
    if isinstance(spec, dict):
        return [x for key in spec for x in _leaves(spec[key])]
    if isinstance(spec, (list, tuple)):
        return [x for item in spec for x in _leaves(item)]
    return [spec]


def axes_of(model: torch.nn.Module, dynamic_shapes: Any, dim: str) -> list[tuple[int, int]]:
    """(input position, axis) of every tensor axis that `dynamic_shapes` gives the Dim `dim`."""
    if isinstance(dynamic_shapes, dict):
        names = list(inspect.signature(model.forward).parameters)
        per_input = [(names.index(k), v) for k, v in dynamic_shapes.items() if k in names]
    else:
        per_input = list(enumerate(dynamic_shapes))
    found = []
    for position, spec in per_input:
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        found += [(position, axis) for axis, d in items if getattr(d, "__name__", None) == dim]
    return found


def constrained_dims(exc: Exception, model, args: tuple, dynamic_shapes: Any) -> dict[str, int]:
    """{Dim name: example size} of the dims a constraint violation names ("Constraints violated
    (seq)!") when torch suggests no fix for them: the guards it found (`seq % 8 == 0` inside a
    chunked scan) have no dynamic form torch can state, so like a constant they get static sizes."""
    text = str(exc)
    head = re.search(r"Constraints violated \(([^)]*)\)", text)
    if dynamic_shapes is None or head is None or fix_lines(text):
        return {}
    found = {}
    for name in (n.strip() for n in head.group(1).split(",")):
        sizes = {int(args[p].shape[a]) for p, a in axes_of(model, dynamic_shapes, name)
                 if p < len(args) and hasattr(args[p], "shape") and a < len(args[p].shape)}
        if len(sizes) == 1:
            found[name] = sizes.pop()
    return found


def describe(refinements: list[Refinement]) -> str:
    """One line for the log: the fixes torch suggested, as applied."""
    return "; ".join(r.fix for r in refinements)
