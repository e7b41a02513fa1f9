"""Attribute literals and size expressions of .dzir text, evaluated within `limits`.

The parser hands each literal's syntax tree here. Every node is checked before anything is
computed: nesting depth and node count, integer literals' digits, and for each operation a
bound on its result (constants are folded exactly and must stay within `MAX_INT`; an expression
with size symbols carries its polynomial degree, which must stay below `MAX_DEGREE`, so power
towers are refused). Only then are sympy expressions built, from parts known to be small.
Max and Min are built without sympy's pairwise comparisons (symbolic.extremum), and since sympy
compares every pair whenever it rebuilds one, their distinct arguments, argument pairs and size
are counted and bounded too. Errors are IRParseErrors at the offending token's line and column.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any, NamedTuple

import sympy
from lark import Token

from ..errors import IRParseError
from . import symbolic
from .dtypes import DTYPE_NAMES, DType
from .limits import (
    MAX_DEGREE,
    MAX_DEPTH,
    MAX_EXPONENT,
    MAX_EXTREMA_ARGS,
    MAX_EXTREMA_NODES,
    MAX_EXTREMA_PAIRS,
    MAX_INT,
    MAX_INT_DIGITS,
    MAX_NODES,
    MAX_TERMS,
)

_ARITY = {"floor": (1, 1), "ceiling": (1, 1), "Mod": (2, 2), "Max": (1, 16), "Min": (1, 16)}
_EXTREMA = {"Max": sympy.Max, "Min": sympy.Min}


def position(item) -> str:
    """'line L, column C' of a token or a tree (its first token)."""
    if isinstance(item, Token):
        return f"line {item.line}, column {item.column}"
    meta = getattr(item, "meta", None)
    if meta is not None and not getattr(meta, "empty", True):
        return f"line {meta.line}, column {meta.column}"
    for child in getattr(item, "children", ()):
        if child is not None:
            return position(child)
    return "line ?, column ?"


def string(tok: Token, source: str) -> str:
    """A JSON string token's text; bad escapes and raw control characters are parse errors."""
    try:
        value = json.loads(tok)
    except ValueError as exc:
        raise IRParseError(f"invalid string {str(tok)[:40]!r}: {exc.args[0].split(':')[0]}",
                           f"{source}: {position(tok)}",
                           "write control characters as JSON escapes (\\n, \\u0007)") from None
    return value


def integer(tok: Token, source: str) -> int:
    """An INT token as an int, refused past MAX_INT_DIGITS digits or MAX_INT (2**63 itself is
    allowed: it is how the smallest int64, -9223372036854775808, is written)."""
    if len(tok) > MAX_INT_DIGITS or int(tok) > MAX_INT:
        raise IRParseError(f"integer {str(tok)[:24]}{'...' if len(tok) > 24 else ''} is too "
                           f"large (at most 2**63)", f"{source}: {position(tok)}")
    return int(tok)


class Evaluator:
    """Turns literal trees into Python values and sympy size expressions, within bounds."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, what: str, item, fix: str | None = None):
        raise IRParseError(what, f"{self.source}: {position(item)}", fix)

    # -- attribute literals ------------------------------------------------------------------

    def literal(self, tree, depth: int = 0):
        """An attribute value: list, string, bool, none, float, dtype or size expression."""
        if depth > MAX_DEPTH:
            self.fail(f"literal nested more than {MAX_DEPTH} deep", tree)
        kind = tree.data
        if kind == "list":
            items = [c for c in tree.children if c is not None]
            return [self.literal(c, depth + 1) for c in items]
        if kind == "string":
            return string(tree.children[0], self.source)
        if kind in ("true", "false", "none"):
            return {"true": True, "false": False, "none": None}[kind]
        if kind in ("float", "neg_float"):
            value = float(tree.children[0])
            return -value if kind == "neg_float" else value
        if kind == "name" and tree.children[0] in DTYPE_NAMES:
            return DType(str(tree.children[0]))
        return self.size(tree, depth)

    def dim(self, tree) -> symbolic.Dim:
        """A dim of a tensor type: a non-negative integer or an integer-valued expression."""
        value = self.size(tree)
        if isinstance(value, int):
            if value < 0:
                self.fail(f"dim {value} is negative", tree, "sizes are 0 or more")
            return value
        if not isinstance(value, sympy.Expr) or value.is_integer is not True:
            self.fail(f"dim {value} is not an integer", tree,
                      "use floor(a/b) or ceiling(a/b) for a division")
        return value

    # -- size expressions --------------------------------------------------------------------

    def size(self, tree, depth: int = 0):
        """An int or a sympy expression; Fractions that are not integers stay sympy Rationals."""
        value = self._expr(tree, depth, [MAX_NODES]).value
        if isinstance(value, sympy.Basic) and value.has(sympy.zoo, sympy.nan, sympy.oo,
                                                        -sympy.oo):
            self.fail(f"cannot evaluate size expression: {str(value)[:80]} divides by zero",
                      tree)
        if isinstance(value, Fraction):
            return int(value) if value.denominator == 1 else sympy.Rational(
                value.numerator, value.denominator)
        return symbolic.normalize(value)

    def _expr(self, tree, depth: int, budget: list[int]) -> _Part:
        if depth > MAX_DEPTH:
            self.fail(f"size expression nested more than {MAX_DEPTH} deep", tree)
        budget[0] -= 1
        if budget[0] < 0:
            self.fail(f"size expression has more than {MAX_NODES} operations", tree)
        kind, ch = tree.data, tree.children
        if kind == "int":
            return _Part(Fraction(integer(ch[0], self.source)), 0, 1, 0)
        if kind == "name":
            if ch[0] in DTYPE_NAMES:
                self.fail(f"'{ch[0]}' is a dtype, not a size", ch[0],
                          "a size is an integer or an expression of size symbols")
            return _Part(symbolic.symbol(str(ch[0])), 1, 1, 0)
        if kind == "call":
            return self._call(tree, depth, budget)
        if kind == "neg":
            part = self._expr(ch[0], depth + 1, budget)
            return part._replace(value=-part.value)
        if kind not in ("add", "sub", "mul", "truediv", "pow"):
            self.fail(f"a {kind.replace('_', ' ')} is not a size expression", tree)
        if kind in ("mul", "truediv"):
            return self._product(tree, depth, budget)
        a, b = (self._expr(c, depth + 1, budget) for c in ch)
        if kind == "pow":
            return self._pow(tree, a, b)
        return self._sum(kind, a, b, tree)

    def _product(self, tree, depth: int, budget: list[int]) -> _Part:
        """A chain of `*` and `/` as the one sympy product it prints from: sympy prints
        Mul(2, 1/s1, s0 + 1) as `2*(s0 + 1)/s1` and Mul(1/2, 1/s0, s0 + 1) as
        `(s0 + 1)/(2*s0)`; multiplying step by step would distribute 2 (or 1/2) over s0 + 1
        and read back an expression of the same value that prints differently. A divisor
        that is itself a product divides by each of its factors."""
        numerator, denominator = self._factors(tree, budget)
        parts = [self._expr(f, depth + 1, budget) for f in numerator + denominator]
        if any(p.value == 0 for p in parts[len(numerator):]):
            self.fail("cannot evaluate size expression: it divides by zero", tree)
        values = [p.value if i < len(numerator) else p.value ** -1 if isinstance(
            p.value, Fraction) else _sympy(p.value) ** -1 for i, p in enumerate(parts)]
        if all(isinstance(v, Fraction) for v in values):
            return _Part(self._bounded(math.prod(values, start=Fraction(1)), tree), 0, 1, 0)
        part = _Part(None, sum(p.degree for p in parts), math.prod(p.terms for p in parts),
                     sum(p.pairs for p in parts))
        self._check(part, tree)
        return part._replace(value=self._built(lambda: sympy.Mul(*map(_sympy, values)), tree))

    def _factors(self, tree, budget: list[int]) -> tuple[list, list]:
        """The numerator and denominator factors of a left-leaning chain of mul and truediv
        (`a*b/(c*d)*e` is mul(truediv(mul(a, b), mul(c, d)), e)), each chain node counted."""
        numerator, denominator, node = [], [], tree
        while node.data in ("mul", "truediv"):
            budget[0] -= 1
            left, right = node.children
            if node.data == "mul":
                numerator.append(right)
            else:
                divisors = []
                while right.data == "mul":
                    divisors.append(right.children[1])
                    right = right.children[0]
                denominator += [right, *reversed(divisors)]
            node = left
        if budget[0] < 0:
            self.fail(f"size expression has more than {MAX_NODES} operations", tree)
        return [node, *reversed(numerator)], denominator

    def _sum(self, kind: str, a: _Part, b: _Part, tree) -> _Part:
        x, y = a.value, b.value
        if isinstance(x, Fraction) and isinstance(y, Fraction):
            return _Part(self._bounded(x + y if kind == "add" else x - y, tree), 0, 1, 0)
        part = _Part(None, max(a.degree, b.degree), a.terms + b.terms, a.pairs + b.pairs)
        self._check(part, tree)
        x, y = _sympy(x), _sympy(y)
        return part._replace(value=self._built(lambda: x + y if kind == "add" else x - y, tree))

    def _pow(self, tree, base: _Part, exponent: _Part) -> _Part:
        e = exponent.value
        if not isinstance(e, Fraction) or e.denominator != 1:
            self.fail(f"power with exponent {e}: exponents must be integer constants", tree)
        if e < 0 and isinstance(base.value, Fraction):
            self.fail(f"power with negative exponent {e}", tree,
                      "sizes are integers; write a division as floor(a/b)")
        e = int(e)
        if isinstance(base.value, Fraction):
            b = base.value
            bits = max(abs(b.numerator).bit_length(), b.denominator.bit_length())
            if b not in (0, 1, -1) and (bits - 1) * e >= 64:
                self.fail(f"power {b}**{e} is too large (at most 2**63)", tree)
            return _Part(self._bounded(b ** e, tree), 0, 1, 0)
        if abs(e) > MAX_EXPONENT:
            self.fail(f"power of a size expression with exponent {e} (at most {MAX_EXPONENT} "
                      "either way)", tree)
        # a sum of t terms to the e-th power expands to at most comb(t + e - 1, e) monomials;
        # sympy prints 1/s0**2 as s0**(-2): a negative power counts as the positive one
        terms = math.comb(min(base.terms, MAX_TERMS + 1) + abs(e) - 1, abs(e)) if e else 1
        part = _Part(None, base.degree * abs(e), terms, base.pairs)
        self._check(part, tree)
        return part._replace(value=self._built(lambda: _sympy(base.value) ** e, tree))

    def _call(self, tree, depth: int, budget: list[int]) -> _Part:
        fn, *args = tree.children
        if fn not in symbolic.FUNCTIONS:
            self.fail(f"unknown size function '{fn}'", fn,
                      f"use one of {sorted(symbolic.FUNCTIONS)}")
        lo, hi = _ARITY[str(fn)]
        if not lo <= len(args) <= hi:
            self.fail(f"{fn} takes {lo if lo == hi else f'{lo} to {hi}'} argument(s), "
                      f"got {len(args)}", fn)
        parts = [self._expr(a, depth + 1, budget) for a in args]
        values = [p.value for p in parts]
        if fn == "Mod" and values[1] == 0:
            self.fail("cannot evaluate size expression: Mod by zero", tree)
        if all(isinstance(v, Fraction) for v in values):
            value = {"floor": lambda: Fraction(math.floor(values[0])),
                     "ceiling": lambda: Fraction(math.ceil(values[0])),
                     "Mod": lambda: values[0] % values[1],
                     "Max": lambda: max(values), "Min": lambda: min(values)}[str(fn)]()
            return _Part(self._bounded(value, tree), 0, 1, 0)
        part = _Part(None, max(p.degree for p in parts), sum(p.terms for p in parts),
                     sum(p.pairs for p in parts))
        self._check(part, tree)
        value = self._built(lambda: symbolic.FUNCTIONS[fn](*(_sympy(v) for v in values)), tree)
        if fn in _EXTREMA:
            part = part._replace(pairs=part.pairs + self._extremum_pairs(fn, value, tree))
            self._check(part, tree)
        return part._replace(value=value)

    def _extremum_pairs(self, fn: Token, value, tree) -> int:
        """Pairs of arguments sympy compares when it rebuilds this Max/Min (in a shape rule's
        floor or ceiling, in simplify), each a few milliseconds of assumption queries: the
        count of its distinct arguments and their size are bounded so that this work is."""
        args = value.args if type(value) is _EXTREMA[str(fn)] else (value,)
        if len(args) > MAX_EXTREMA_ARGS:
            self.fail(f"{fn} has {len(args)} distinct arguments (at most {MAX_EXTREMA_ARGS})",
                      fn, "sizes are small expressions of a few symbols")
        if symbolic.node_count(value, MAX_EXTREMA_NODES + 1) > MAX_EXTREMA_NODES:
            self.fail(f"{fn}'s arguments have more than {MAX_EXTREMA_NODES} terms and "
                      "operations", fn, "sizes are small expressions of a few symbols")
        return len(args) * (len(args) - 1) // 2

    def _built(self, build, tree):
        """build()'s sympy value. sympy's own evaluation can fail on hostile operands that
        hide a zero (Mod(s0, Min(s0, 0)): ZeroDivisionError; a Max of zoo: ValueError): an
        error at the operation's position."""
        try:
            return build()
        except (ArithmeticError, ValueError, TypeError) as exc:
            self.fail(f"cannot evaluate size expression: {type(exc).__name__}: "
                      f"{str(exc)[:80]}", tree)

    def _bounded(self, value: Fraction, tree) -> Fraction:
        if abs(value.numerator) > MAX_INT or value.denominator > MAX_INT:
            self.fail("size expression value is too large (at most 2**63)", tree)
        return value

    def _check(self, part: _Part, tree) -> None:
        if part.degree > MAX_DEGREE:
            self.fail(f"size expression has degree {part.degree} in its symbols (at most "
                      f"{MAX_DEGREE}): powers of powers are not sizes", tree)
        if part.terms > MAX_TERMS:
            self.fail(f"size expression expands to more than {MAX_TERMS} terms", tree,
                      "sizes are small expressions of a few symbols")
        if part.pairs > MAX_EXTREMA_PAIRS:
            self.fail(f"size expression's Max and Min have more than {MAX_EXTREMA_PAIRS} "
                      "pairs of arguments to compare", tree,
                      "sizes are small expressions of a few symbols")


class _Part(NamedTuple):
    """A checked subexpression: its value (a Fraction when constant), polynomial degree in the
    size symbols, a bound on the number of terms it expands to, and the pairs of arguments its
    Max and Min have (what sympy compares when it rebuilds them)."""

    value: Any
    degree: int
    terms: int
    pairs: int


def _sympy(value):
    if isinstance(value, Fraction):
        return sympy.Rational(value.numerator, value.denominator)
    return value
