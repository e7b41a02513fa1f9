"""Patterns: declarative descriptions of subgraphs, written like the code they match.

A pattern is a small tree of `OpPattern`s (an op, its operand patterns, constraints on its
attributes), `Var`s (any value, bound by name; a name used twice must bind one value), `Const`s
(a scalar constant, optionally of a given value) and `AnyOf` alternatives. One pattern object used
in two places must match one graph value (a shared subexpression, like `x - mean` in a layer
norm). Patterns are written as functions, onnxscript-style:

    def pattern(op, x, eps):
        return op.mul(x, op.rsqrt(op.add(op.mean(op.pow(x, 2.0), dims=[-1]), eps)))

`op.<name>(...)` builds an `OpPattern` for a registered IR op (a typo fails at import, naming
the op); Python numbers become `Const`s; the function's parameters after `op` become `Var`s.
Commutativity comes from the op table, so `op.mul(a, b)` also matches `mul(b, a)`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compiler.ir import get_op


class Pattern:
    """Base of the pattern node types; patterns compare by identity (sharing is meaningful)."""

    name: str | None = None


@dataclass(eq=False)
class Var(Pattern):
    """Any value (or an absent optional operand: binds None), bound to `name`."""

    name: str


@dataclass(eq=False)
class Const(Pattern):
    """A 0-d constant: a `constant`/`full` node or a one-element weight, maybe behind casts.

    `value` None accepts any scalar; `name` binds the Python value found.
    """

    value: float | int | bool | None = None
    name: str | None = None
    rel_tol: float = 1e-6


@dataclass(eq=False)
class Capture:
    """An attribute constraint that accepts any value and binds it to `name`."""

    name: str


@dataclass(eq=False)
class OpPattern(Pattern):
    """`op` applied to operand patterns (None: the operand must be absent); `attrs` constrain
    attributes by literal value, `Capture`, or a predicate `value -> bool`; `output` picks the
    result of a multi-result op; `name` binds the matched value."""

    op: str
    inputs: tuple[Pattern | None, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    output: int = 0


@dataclass(eq=False)
class AnyOf(Pattern):
    """The first alternative that matches (each is tried, with backtracking)."""

    alternatives: tuple[Pattern, ...]
    name: str | None = None


def as_pattern(item: Any) -> Pattern | None:
    if item is None or isinstance(item, Pattern):
        return item
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        return Const(item)
    raise TypeError(f"cannot use {item!r} as a pattern operand")


class OpBuilder:
    """The `op` argument of pattern functions: `op.mul(a, b)`, `op.mean(x, dims=[-1])`."""

    def __getattr__(self, op: str) -> Callable[..., OpPattern]:
        if op.startswith("_"):
            raise AttributeError(op)
        get_op(op)  # an unknown op fails here, when the pattern is defined

        def build(*inputs: Any, _name: str | None = None, _output: int = 0,
                  **attrs: Any) -> OpPattern:
            return OpPattern(op, tuple(as_pattern(i) for i in inputs), attrs, _name, _output)
        return build

    @staticmethod
    def any_of(*alternatives: Any, name: str | None = None) -> AnyOf:
        return AnyOf(tuple(as_pattern(a) for a in alternatives), name)

    def optional(self, op: str, inner: Any, **attrs: Any) -> AnyOf:
        """`op(inner)` or just `inner`: an op the source may or may not have (a cast, a view)."""
        inner = as_pattern(inner)
        return AnyOf((getattr(self, op)(inner, **attrs), inner))

    @staticmethod
    def const(value: float | int | bool | None = None, name: str | None = None,
              rel_tol: float = 1e-6) -> Const:
        return Const(value, name, rel_tol)

    @staticmethod
    def variable(name: str) -> Var:
        """A named variable besides the function's parameters (`op.var` is the variance op)."""
        return Var(name)

    @staticmethod
    def capture(name: str) -> Capture:
        return Capture(name)


def build_pattern(fn: Callable[..., Any]) -> tuple[Pattern, tuple[str, ...]]:
    """Call a pattern function with `op` and one `Var` per further parameter."""
    params = list(inspect.signature(fn).parameters)[1:]
    root = as_pattern(fn(OpBuilder(), *(Var(p) for p in params)))
    if not isinstance(root, (OpPattern, AnyOf)):
        raise TypeError(f"pattern {fn.__name__} must return an op pattern")
    return root, tuple(params)


def root_ops(pattern: Pattern) -> set[str]:
    """The ops a pattern's root can be (what the driver indexes rules by)."""
    if isinstance(pattern, OpPattern):
        return {pattern.op}
    if isinstance(pattern, AnyOf):
        return set().union(*(root_ops(a) for a in pattern.alternatives))
    raise TypeError("a pattern root must be an op pattern or alternatives of them")
