"""Index expressions: a tensor computed from sizes alone, written as a function of its indices.

A size-only tensor (built by arange, full, comparisons, slicing, ... with no graph input among its
ancestors) has element `x[i_0, ..., i_{r-1}]` equal to a closed-form expression of the index
variables `INDEX[:r]`, with `0 <= i_d <= dim_d - 1` and the dims possibly symbolic (`s0`). This
module holds that representation and the reasoning over it; `recognize_causal_masks` maps ops to
it. Everything here is a proof for every value of the size symbols in their range, never a test at
a few sizes: a fact that cannot be shown is left undecided, and an undecided mask is not rewritten.

An `Indexed` is a list of disjoint, exhaustive cases `(condition, value)`. Conditions are sympy
boolean formulas over canonical linear atoms (`d <= 0`, `Eq(d, 0)`, `Ne(d, 0)` with `d` integer
and linear in the index variables); values are integer expressions linear in the index variables,
opaque float constants (`-oo`, a dtype's min) or, for bool tensors, one formula. Keeping the cases
at the top (rather than nesting sympy `Piecewise`) is what makes simplification a plain walk:
each case's condition narrows the index ranges (`i_1 <= 0` with `i_1 >= 0` pins `i_1 = 0`), and
atoms decided by the ranges turn into true/false.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sympy
from sympy.core.relational import Relational
from sympy.logic.boolalg import And, Boolean, Not, Or

from compiler.ir.dtypes import DType
from compiler.ir.symbolic import Dim

MAX_RANK = 16
INDEX = tuple(sympy.Symbol(f"_i{k}", integer=True, nonnegative=True) for k in range(MAX_RANK))
_INDEX_SET = frozenset(INDEX)
MAX_CASES = 64  # beyond this an expression is not a mask worth proving; give up instead
UNBOUNDED_SIZE = 2**40  # no tensor dim is larger; used only to bound values (overflow checks)

Ranges = Mapping[str, tuple[int, "int | None"]]


@dataclass(frozen=True)
class Indexed:
    """A size-only tensor: `shape`, element `kind` and disjoint exhaustive `cases`.

    Bool tensors hold a single case `(true, formula)`; `INDEX[d]` is the index along dim d, and a
    dim of static size 1 has its variable replaced by 0 (that is how broadcasting reads it).
    """

    shape: tuple[Dim, ...]
    kind: str
    cases: tuple[tuple[Boolean, sympy.Basic], ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def formula(self) -> Boolean:
        """The condition under which a bool tensor's element is true."""
        assert self.kind == "bool"
        return self.cases[0][1]


def build(shape, kind: str, cases) -> Indexed | None:
    """An `Indexed` from cases, folding bool cases into one formula; None if too many cases."""
    shape = tuple(shape)
    if len(shape) > MAX_RANK:
        return None
    cases = [(c, v) for c, v in cases if c is not sympy.false]
    if kind == "bool":
        cases = [(sympy.true, Or(*(And(c, v) for c, v in cases)))]
    if not cases or len(cases) > MAX_CASES:
        return None
    ones = {INDEX[d]: sympy.Integer(0) for d, n in enumerate(shape) if n == 1}
    if ones:
        cases = [(c.xreplace(ones), v.xreplace(ones)) for c, v in cases]
    return Indexed(shape, kind, tuple(cases))


def constant(shape, kind: str, value: sympy.Basic) -> Indexed:
    return build(shape, kind, [(sympy.true, value)])


def reindex(x: Indexed, shape, mapping: Mapping[sympy.Symbol, sympy.Basic]) -> Indexed | None:
    """`x` read at indices given by `mapping` (x's variables -> expressions of the new ones)."""
    return build(shape, x.kind, [(c.xreplace(mapping), v.xreplace(mapping)) for c, v in x.cases])


def broadcast(x: Indexed, shape) -> Indexed | None:
    """`x` broadcast (numpy rules, aligned right) to `shape`."""
    lead = len(shape) - x.rank
    if lead < 0:
        return None
    return reindex(x, shape, {INDEX[d]: INDEX[d + lead] for d in range(x.rank)})


def combine(fn: Callable[..., sympy.Basic | None], kind: str, shape,
            *xs: Indexed) -> Indexed | None:
    """Apply `fn` to the values of every combination of the operands' cases (broadcast first);
    `fn` returns None to give up."""
    xs = [broadcast(x, shape) for x in xs]
    if any(x is None for x in xs):
        return None
    cases = []
    for combo in itertools.product(*(x.cases for x in xs)):
        value = fn(*(v for _, v in combo))
        if value is None:
            return None
        cases.append((And(*(c for c, _ in combo)), value))
    return build(shape, kind, cases)


def as_cases(x: Indexed) -> list[tuple[Boolean, sympy.Basic]]:
    """A bool tensor as int-like cases: [(formula, 1), (not formula, 0)]."""
    if x.kind != "bool":
        return list(x.cases)
    return [(x.formula, sympy.Integer(1)), (negate(x.formula), sympy.Integer(0))]


# -- canonical linear atoms ------------------------------------------------------------------------
def linear_terms(expr: sympy.Basic, variables) -> tuple[dict, sympy.Basic] | None:
    """`expr` as ({var: numeric coefficient}, rest free of `variables`), or None if not linear."""
    coefs: dict[sympy.Symbol, sympy.Basic] = {}
    rest = sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        coef, factor = term.as_coeff_Mul()
        if factor in variables:
            coefs[factor] = coefs.get(factor, 0) + coef
        elif factor.free_symbols & variables:
            return None
        else:
            rest += term
    return {v: a for v, a in coefs.items() if a != 0}, rest


def atom_parts(rel: Relational) -> tuple[str, sympy.Basic] | None:
    """A relation over integers as ("le", d) for d <= 0, ("eq", d) or ("ne", d); None if its
    sides are not provably integers (floats, infinities)."""
    d = sympy.expand(rel.lhs - rel.rhs)
    if d.is_integer is not True:
        return None
    forms = {sympy.Le: ("le", d), sympy.Lt: ("le", d + 1), sympy.Ge: ("le", -d),
             sympy.Gt: ("le", 1 - d), sympy.Eq: ("eq", d), sympy.Ne: ("ne", d)}
    return forms.get(type(rel))


def make_atom(kind: str, d: sympy.Basic) -> Boolean:
    """The canonical relation for ("le"|"eq"|"ne", d): integer coefficients divided by their gcd,
    and for (in)equalities the sign fixed, so equal atoms compare equal structurally."""
    d = sympy.expand(d)
    terms = [t.as_coeff_Mul() for t in sympy.Add.make_args(d) if t.free_symbols]
    const = d - sympy.Add(*(a * f for a, f in terms))
    if terms and const.is_Integer and all(a.is_Integer for a, _ in terms):
        g = math.gcd(*(int(a) for a, _ in terms))
        if kind == "le":
            d = sympy.Add(*(a / g * f for a, f in terms)) + sympy.ceiling(sympy.Rational(const, g))
        elif int(const) % g:
            return sympy.false if kind == "eq" else sympy.true
        else:
            d = sympy.expand(d / g)
        if kind != "le" and sorted(terms, key=lambda t: sympy.default_sort_key(t[1]))[0][0] < 0:
            d = -d
    return {"le": sympy.Le, "eq": sympy.Eq, "ne": sympy.Ne}[kind](d, 0)


def negate(f: Boolean) -> Boolean:
    """not f, pushed down to the atoms (de Morgan), so simplification sees only And/Or/atoms."""
    if f is sympy.true or f is sympy.false:
        return sympy.false if f is sympy.true else sympy.true
    if isinstance(f, Not):
        return f.args[0]
    if isinstance(f, And):
        return Or(*(negate(a) for a in f.args))
    if isinstance(f, Or):
        return And(*(negate(a) for a in f.args))
    parts = atom_parts(f) if isinstance(f, Relational) else None
    if parts is None:
        return Not(f)
    kind, d = parts
    return make_atom({"le": "le", "eq": "ne", "ne": "eq"}[kind], 1 - d if kind == "le" else d)


# -- signs over the size-symbol ranges ---------------------------------------------------------
def _extreme(expr: sympy.Basic, ranges: Ranges, upper: bool, cap: int | None) -> sympy.Basic | None:
    """Max (or min) of `expr` over the size symbols' ranges when it is linear in them; an open
    upper end counts as `cap` (None: unknown)."""
    symbols = frozenset(s for s in expr.free_symbols)
    split = linear_terms(expr, symbols)
    if split is None or not split[1].is_number:
        return None
    coefs, total = split
    for sym, coef in coefs.items():
        if not coef.is_number:
            return None
        lo, hi = ranges.get(sym.name, (1, None))
        bound = hi if (coef > 0) == upper else lo
        if bound is None:
            bound = cap
        if bound is None:
            return None
        total += coef * bound
    return total


def nonpositive(expr: sympy.Basic, ranges: Ranges, cap: int | None = None) -> bool:
    """True when `expr` (over size symbols only) is <= 0 for every value in the ranges (an open
    range counting up to `cap` when one is given)."""
    expr = sympy.expand(expr)
    if expr.is_number:
        return bool(expr <= 0)
    if expr.free_symbols & _INDEX_SET:
        return False
    top = _extreme(expr, ranges, upper=True, cap=cap)
    if top is not None:
        return bool(top <= 0)
    # Not linear in the symbols: shift each to lo + u with u >= 0 and ask sympy for the sign.
    shifted = {s: ranges.get(s.name, (1, None))[0] + sympy.Symbol(f"_u_{s.name}", integer=True,
                                                                   nonnegative=True)
               for s in expr.free_symbols}
    return sympy.expand(expr.xreplace(shifted)).is_nonpositive is True


# -- index ranges and simplification -------------------------------------------------------------
class Context:
    """What is known at one point of a case split: the size ranges and each index's [lo, hi]."""

    __slots__ = ("ranges", "bounds")

    def __init__(self, ranges: Ranges, bounds: dict):
        self.ranges = ranges
        self.bounds = bounds

    @classmethod
    def of(cls, shape, ranges: Ranges) -> Context:
        return cls(ranges, {INDEX[d]: (sympy.Integer(0), sympy.sympify(n) - 1)
                            for d, n in enumerate(shape)})

    def pinned(self) -> dict:
        """Index variables narrowed to a single value, with that value."""
        return {v: lo for v, (lo, hi) in self.bounds.items() if sympy.expand(hi - lo) == 0}

    def span(self, expr: sympy.Basic) -> tuple[sympy.Basic, sympy.Basic] | None:
        """Symbolic (min, max) of an expression linear in the index variables, or None."""
        split = linear_terms(expr, _INDEX_SET)
        if split is None or any(not a.is_number or v not in self.bounds
                                for v, a in split[0].items()):
            return None
        coefs, lo = split
        hi = lo
        for v, a in coefs.items():
            vlo, vhi = self.bounds[v]
            lo, hi = lo + a * (vlo if a > 0 else vhi), hi + a * (vhi if a > 0 else vlo)
        return lo, hi

    def decide(self, rel: Relational) -> Boolean:
        """An atom, decided true/false when the index ranges settle it, else canonical."""
        parts = atom_parts(rel)
        if parts is None:
            return rel
        kind, d = parts
        d = sympy.expand(d.xreplace(self.pinned()))
        span = self.span(d)
        if span is not None:
            lo, hi = span
            le0, ge0 = nonpositive(hi, self.ranges), nonpositive(-lo, self.ranges)
            below, above = nonpositive(hi + 1, self.ranges), nonpositive(1 - lo, self.ranges)
            verdict = {"le": True if le0 else False if above else None,
                       "eq": True if le0 and ge0 else False if below or above else None}
            verdict["ne"] = None if verdict["eq"] is None else not verdict["eq"]
            if verdict[kind] is not None:
                return sympy.true if verdict[kind] else sympy.false
        return make_atom(kind, d)

    def refined(self, f: Boolean) -> Context | None:
        """This context also knowing `f` (its single-index atoms); None if that is impossible."""
        atoms = f.args if isinstance(f, And) else (f,)
        bounds = dict(self.bounds)
        for atom in atoms:
            narrowed = _narrow(atom, bounds, self.ranges)
            if narrowed is None:
                return None
            bounds = narrowed
        return Context(self.ranges, bounds)


def _narrow(atom: Boolean, bounds: dict, ranges: Ranges) -> dict | None:
    """Index bounds tightened by one atom `a*v + c <= 0` or `a*v + c == 0` (None: infeasible)."""
    parts = atom_parts(atom) if isinstance(atom, Relational) else None
    split = None if parts is None or parts[0] == "ne" else linear_terms(parts[1], _INDEX_SET)
    if split is None or len(split[0]) != 1:
        return bounds
    ((v, a),), c = split[0].items(), split[1]
    if v not in bounds or not a.is_Integer:
        return bounds
    lo, hi = bounds[v]
    if parts[0] == "eq":
        if abs(a) != 1:
            return bounds
        value = -c * a
        new_lo, new_hi = value, value
    elif a > 0:  # v <= floor(-c / a)
        new_lo, new_hi = lo, sympy.floor(-c / a)
    else:  # v >= ceiling(c / |a|)
        new_lo, new_hi = sympy.ceiling(c / -a), hi
    if nonpositive(lo - new_lo, ranges):
        lo = new_lo
    if nonpositive(new_hi - hi, ranges):
        hi = new_hi
    if nonpositive(hi - lo + 1, ranges):
        return None
    return {**bounds, v: (lo, hi)}


def simplify_formula(f: Boolean, ctx: Context) -> Boolean:
    """`f` with every atom the context decides replaced by true/false; a conjunction's later
    terms are simplified knowing its earlier ones."""
    if f is sympy.true or f is sympy.false:
        return f
    if isinstance(f, Relational):
        return ctx.decide(f)
    if isinstance(f, Not):
        inner = negate(f.args[0])
        return Not(inner) if isinstance(inner, Not) else simplify_formula(inner, ctx)
    if isinstance(f, Or):
        return Or(*(simplify_formula(a, ctx) for a in f.args))
    if isinstance(f, And):
        kept = []
        for arg in f.args:
            arg = simplify_formula(arg, ctx)
            narrowed = ctx.refined(arg)
            if arg is sympy.false or narrowed is None:
                return sympy.false
            ctx = narrowed
            kept.append(arg)
        return And(*kept)
    return f


def simplify(x: Indexed, ranges: Ranges) -> Indexed | None:
    """Decide what the index ranges decide, drop impossible cases, merge cases of equal value."""
    ctx = Context.of(x.shape, ranges)
    merged: dict[sympy.Basic, list[Boolean]] = {}
    for cond, value in x.cases:
        cond = simplify_formula(cond, ctx)
        inner = None if cond is sympy.false else ctx.refined(cond)
        if inner is None:
            continue
        if x.kind == "bool":
            value = simplify_formula(value, inner)
        else:
            value = sympy.expand(value.xreplace(inner.pinned()))
        merged.setdefault(value, []).append(cond)
    if len(merged) == 1:
        return build(x.shape, x.kind, [(sympy.true, next(iter(merged)))])
    return build(x.shape, x.kind, [(Or(*conds), value) for value, conds in merged.items()])


def provably_within(x: Indexed, lo: sympy.Basic, hi: sympy.Basic, ranges: Ranges,
                    cap: int | None = None) -> bool:
    """True when every value of `x` lies in [lo, hi] (bounds may be symbolic) for all sizes; an
    open size range counts up to `cap` (None: the bound must hold for every size)."""
    ctx = Context.of(x.shape, ranges)
    for cond, value in x.cases:
        inner = ctx.refined(cond) or ctx
        span = inner.span(value) if value.is_integer else None
        if span is None or not (nonpositive(lo - span[0], ranges, cap)
                                and nonpositive(span[1] - hi, ranges, cap)):
            return False
    return True


# -- dtypes ----------------------------------------------------------------------------------------
# Integers every value of an integer dtype can hold, and the bound below which a float dtype holds
# every integer exactly: tensor arithmetic is exact integer math only inside these.
INT_LIMITS = {DType.i64: (-2**63, 2**63 - 1), DType.i32: (-2**31, 2**31 - 1),
              DType.i16: (-2**15, 2**15 - 1), DType.i8: (-2**7, 2**7 - 1), DType.u8: (0, 255)}
FLOAT_EXACT = {DType.f64: 2**53, DType.f32: 2**24, DType.f16: 2**11, DType.bf16: 2**8,
               DType.f8e4m3: 2**4, DType.f8e5m2: 2**3}


def kind_of(dtype: DType) -> str:
    return "bool" if dtype == DType.bool else "float" if dtype.is_float else "int"


def scalar(value, dtype: DType) -> sympy.Basic:
    """A constant as an expression: integers exact, other floats opaque (-oo, 0.1, f32's min)."""
    if dtype == DType.bool:
        return sympy.true if value else sympy.false
    if isinstance(value, sympy.Basic):
        return value
    if dtype.is_float:
        if math.isinf(value):
            return sympy.oo if value > 0 else -sympy.oo
        if float(value).is_integer() and abs(value) <= FLOAT_EXACT[dtype]:
            return sympy.Integer(int(value))
        return sympy.Float(value)
    return sympy.Integer(int(value))


def fits(x: Indexed, dtype: DType, ranges: Ranges) -> bool:
    """Whether exact math is the tensor's math: every integer value fits `dtype` exactly (an open
    size range counting up to UNBOUNDED_SIZE); opaque float constants pass as they are."""
    if x.kind == "bool":
        return True
    exact = tuple((c, v) for c, v in x.cases if v.is_integer)
    if x.kind == "int" and len(exact) != len(x.cases):
        return False
    lo, hi = INT_LIMITS.get(dtype) or (-FLOAT_EXACT[dtype], FLOAT_EXACT[dtype])
    return provably_within(Indexed(x.shape, x.kind, exact), sympy.Integer(lo),
                           sympy.Integer(hi), ranges, cap=UNBOUNDED_SIZE)
