"""Symbolic dimensions.

A dim is a Python int or a sympy expression over named size symbols (`s0`, `8*s0`, `floor(s0/2)`).
sympy keeps expressions canonical, so `str()` is a stable text form that the IR parser reads back
into an equal expression; every symbol is created through `symbol()` so assumptions always agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from fractions import Fraction
from typing import Union

import sympy

from .limits import MAX_EVAL_STEPS, MAX_SIMPLIFY_NODES, MAX_VALUE_BITS

Dim = Union[int, sympy.Expr]


def symbol(name: str) -> sympy.Symbol:
    """The one way to make a size symbol: sizes are positive integers."""
    return sympy.Symbol(name, integer=True, positive=True)


def normalize(dim: Dim) -> Dim:
    """Plain ints for constant dims, so `Integer(4)` and `4` print and compare the same."""
    if isinstance(dim, sympy.Basic):
        if dim.is_Integer:
            return int(dim)
        return dim
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"not a dimension: {dim!r}")
    return dim


def is_static(dim: Dim) -> bool:
    return isinstance(normalize(dim), int)


def is_size(dim) -> bool:
    """Whether `dim` can be a size: an int >= 0, or an expression sympy knows is an integer
    (not a fraction such as s0/2, not zoo or nan from a division by zero)."""
    if isinstance(dim, bool):
        return False
    if isinstance(dim, int):
        return dim >= 0
    if isinstance(dim, sympy.Integer):
        return int(dim) >= 0
    return isinstance(dim, sympy.Expr) and dim.is_integer is True


def dim_str(dim: Dim) -> str:
    return str(normalize(dim))


def free_symbols(dim: Dim) -> set[str]:
    dim = normalize(dim)
    if isinstance(dim, int):
        return set()
    return {s.name for s in dim.free_symbols}


# Distinct positive sizes at which two dims are compared before sympy.simplify is asked to
# prove them equal: a difference that is not zero at one of them proves the dims differ
# without simplify, which can take minutes on a large expression (untrusted .dzir text).
_PROBES = ((2, 3, 5, 7, 11, 13, 17, 19, 23, 29), (31, 7, 1, 64, 5, 3, 128, 9, 2, 17))


def equal(a: Dim, b: Dim) -> bool:
    """True when two dims are provably the same size.

    Equal structure proves it; a probe where the difference is not zero disproves it; what no
    probe tells apart goes to `_proven_zero`, whose sympy work is bounded by counts."""
    a, b = normalize(a), normalize(b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    diff = sympy.sympify(a) - sympy.sympify(b)
    if diff == 0:
        return True
    if diff.is_number:
        return False
    names = sorted(s.name for s in diff.free_symbols)
    for probe in _PROBES:
        values = {n: probe[i % len(probe)] + i // len(probe) for i, n in enumerate(names)}
        value = _probe(diff, values)
        if value is not None and value != 0:
            return False
    return _proven_zero(diff)


def _probe(diff: sympy.Expr, values: Mapping[str, int]) -> Fraction | None:
    """diff's value at `values`, None where it has no finite one."""
    try:
        return exact_value(diff, values)
    except NotExact:
        value = diff.subs({symbol(n): v for n, v in values.items()})
        return Fraction(int(value.p), int(value.q)) if value.is_Rational else None
    except (ZeroDivisionError, ValueError):
        return None


# Calls of sympy's expand-then-simplify left to the current parse (None: no bound). simplify
# costs up to ~0.1 s even on a small difference, and a hostile text can ask for one per node.
_SIMPLIFY_BUDGET: ContextVar[list[int] | None] = ContextVar("simplify_budget", default=None)


@contextmanager
def bounded_simplify(calls: int) -> Iterator[None]:
    """Within this block `equal` asks sympy to prove at most `calls` differences zero; past
    that, a difference no probe tells apart counts as unproven (the dims are not equal)."""
    token = _SIMPLIFY_BUDGET.set([calls])
    try:
        yield
    finally:
        _SIMPLIFY_BUDGET.reset(token)


def _proven_zero(diff: sympy.Expr) -> bool:
    """Whether sympy proves `diff` zero: by expand (polynomial identities), else simplify. Only
    a difference of at most MAX_SIMPLIFY_NODES nodes is tried (simplify's work grows steeply
    with size), within the budget of `bounded_simplify`; an error inside sympy (a division by
    zero it finds, an argument of Max it cannot compare) means unproven."""
    if node_count(diff, MAX_SIMPLIFY_NODES + 1) > MAX_SIMPLIFY_NODES:
        return False
    budget = _SIMPLIFY_BUDGET.get()
    if budget is not None:
        if budget[0] <= 0:
            return False
        budget[0] -= 1
    try:
        return sympy.expand(diff) == 0 or sympy.simplify(diff) == 0
    except (ValueError, TypeError, ArithmeticError, RecursionError):
        return False


def node_count(expr: sympy.Basic, stop: int) -> int:
    """Nodes of an expression tree, counted up to `stop` (so counting a huge tree is cheap)."""
    count, stack = 0, [expr]
    while stack and count < stop:
        node = stack.pop()
        count += 1
        stack.extend(node.args)
    return count


class NotExact(ValueError):
    """An expression `exact_value` does not know (sympy evaluates it the slow way)."""


def exact_value(expr: sympy.Basic, values: Mapping[str, int],
                max_steps: int = MAX_EVAL_STEPS) -> Fraction:
    """An expression's exact value at integer values of its symbols, by walking its tree once.

    sympy's `subs` rebuilds every node it replaces into, re-running Max/Min's pairwise
    comparisons and floor's simplification at each one: seconds for one 16-argument Max. This
    walk costs one step a node, counted: past `max_steps` nodes, or a value past MAX_VALUE_BITS
    bits, it stops with a ValueError. KeyError names a symbol `values` lacks; a division by
    zero raises ZeroDivisionError; a node it does not know raises NotExact."""
    budget = [max_steps]
    return _exact(expr, values, budget)


def _exact(e: sympy.Basic, values: Mapping[str, int], budget: list[int]) -> Fraction:
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("size expression takes more evaluation steps than allowed")
    if e.is_Rational:
        return Fraction(int(e.p), int(e.q))
    if e.is_Symbol:
        return Fraction(values[e.name])
    rule = _EXACT.get(type(e)) or next((f for t, f in _EXACT.items() if isinstance(e, t)), None)
    if rule is None:
        raise NotExact(f"cannot evaluate {type(e).__name__} exactly")
    value = rule([_exact(a, values, budget) for a in e.args])
    if max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > MAX_VALUE_BITS:
        raise ValueError(f"size expression value has more than {MAX_VALUE_BITS} bits")
    return value


def _power(args: list[Fraction]) -> Fraction:
    base, exponent = args
    if exponent.denominator != 1:
        raise NotExact("a fractional power")
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
    if base not in (0, 1, -1) and (bits - 1) * abs(exponent) > MAX_VALUE_BITS:
        raise ValueError(f"size expression value has more than {MAX_VALUE_BITS} bits")
    return base ** int(exponent)


def _sign(x: Fraction) -> Fraction:
    return Fraction((x > 0) - (x < 0))


# sympy node type -> its value from its arguments' values (exact, as sympy's own)
_EXACT = {
    sympy.Add: lambda a: sum(a, Fraction(0)),
    sympy.Mul: lambda a: math.prod(a, start=Fraction(1)),
    sympy.Pow: _power,
    sympy.floor: lambda a: Fraction(math.floor(a[0])),
    sympy.ceiling: lambda a: Fraction(math.ceil(a[0])),
    sympy.Mod: lambda a: a[0] % a[1],
    sympy.Max: max,
    sympy.Min: min,
    sympy.Abs: lambda a: abs(a[0]),
    sympy.sign: lambda a: _sign(a[0]),
}


def evaluate(dim: Dim, bindings: Mapping[str, int]) -> int:
    """Concrete size of a dim once every symbol has a value (a fraction is truncated to an
    int, as int() of a sympy Rational is)."""
    dim = normalize(dim)
    if isinstance(dim, int):
        return dim
    missing = free_symbols(dim) - set(bindings)
    if missing:
        raise KeyError(f"no value for size symbol(s) {sorted(missing)} in {dim}")
    try:
        return int(exact_value(dim, bindings))
    except NotExact:
        pass
    value = dim.subs({symbol(k): v for k, v in bindings.items() if k in free_symbols(dim)})
    return int(value)


def resolve(attr, bindings: Mapping[str, int]):
    """An attribute with every size expression in it (nested lists too) replaced by its value:
    what an op's reference receives once the symbols are bound."""
    if isinstance(attr, sympy.Basic):
        return evaluate(attr, bindings)
    if isinstance(attr, (list, tuple)):
        return [resolve(a, bindings) for a in attr]
    return attr


def upper_bound(dim: Dim, ranges: Mapping[str, tuple[int, int | None]]) -> int | None:
    """Largest value of a dim given symbol ranges (None if unbounded); sizes grow with symbols."""
    dim = normalize(dim)
    if isinstance(dim, int):
        return dim
    highs = {}
    for name in free_symbols(dim):
        hi = ranges.get(name, (1, None))[1]
        if hi is None:
            return None
        highs[name] = hi
    return evaluate(dim, highs)


def product(dims) -> Dim:
    out: Dim = 1
    for d in dims:
        out = normalize(out * normalize(d))
    return out


def extremum(cls: type, *args: sympy.Expr) -> sympy.Expr:
    """Max or Min of `args` in sympy's canonical form, without sympy's pairwise comparisons.

    sympy.Max(a, b, ...) asks, for each pair of arguments, whether one is provably larger: with
    16 symbolic arguments that is seconds of assumption queries (untrusted .dzir text). Here
    nested Max are flattened, constants folded to one, duplicates dropped, and the rest kept in
    sympy's order: linear work, the same object sympy builds for any Max it printed (whose
    arguments are already pairwise incomparable), and the same value for any other."""
    flat: list[sympy.Expr] = []
    for arg in map(sympy.sympify, args):
        flat.extend(arg.args if isinstance(arg, cls) else (arg,))
    numbers = [a for a in flat if a.is_Number]
    rest = {a for a in flat if not a.is_Number}
    if numbers:
        rest.add(max(numbers) if cls is sympy.Max else min(numbers))
    if len(rest) == 1:
        return rest.pop()
    return cls(*rest, evaluate=False)


def mod(p: sympy.Expr, q: sympy.Expr) -> sympy.Expr:
    """sympy.Mod(p, q), but never sympy 1.14's wrong simplifications of a product p that has
    a Mod factor: with Mod(x, q) it pulls the other factors out of the Mod, Mod(3*x*Mod(x, 5), 5)
    becoming 3*Mod(x**2, 5) (12 instead of 2 at x = 2); with an integer q it counts the Mod
    factors twice, Mod(x*Mod(x, y), 3) becoming Mod(x*Mod(x, y)**2, 3). Nor its endless
    recursion on Mod(x + 2*y + Mod(2*y, x), y + 1). Such a Mod is kept as written: its value is
    right, and it prints and parses back as itself. Build Mods with this, not sympy.Mod (the
    property test in tests/compiler/test_ir_expr_roundtrip.py found all three)."""
    p, q = sympy.sympify(p), sympy.sympify(q)
    if isinstance(p, sympy.Mul) and any(isinstance(a, sympy.Mod) for a in p.args):
        return sympy.Mod(p, q, evaluate=False)
    try:
        return sympy.Mod(p, q)
    except RecursionError:
        return sympy.Mod(p, q, evaluate=False)


def _as_written(cls: type):
    return lambda *args: cls(*args, evaluate=False)


# Builders used by the IR parser; names follow sympy's printed form. floor, ceiling and Mod are
# built as written: sympy printed them evaluated, and evaluating them again is not always a
# no-op (it wrote 2*s1 + floor(s1/(s1 + 1)), whose floor it evaluates to 0 when read back),
# nor always right (see `mod`), nor cheap (tens of ms for a Mod of two long sums).
FUNCTIONS = {
    "floor": _as_written(sympy.floor),
    "ceiling": _as_written(sympy.ceiling),
    "Mod": _as_written(sympy.Mod),
    "Max": lambda *args: extremum(sympy.Max, *args),
    "Min": lambda *args: extremum(sympy.Min, *args),
}
