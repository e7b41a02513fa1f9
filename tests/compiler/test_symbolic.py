"""Symbolic dims: normalize / equal / evaluate / upper_bound / product, and their algebra."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from compiler.ir.symbolic import (
    dim_str,
    equal,
    evaluate,
    free_symbols,
    is_static,
    normalize,
    product,
    symbol,
    upper_bound,
)

S0, S1 = symbol("s0"), symbol("s1")


# -- normalize ------------------------------------------------------------------------------------
def test_normalize_turns_sympy_integers_into_ints():
    for dim in (sympy.Integer(4), S0 - S0 + 4, sympy.floor(sympy.Integer(9) / 2)):
        out = normalize(dim)
        assert out == 4 and type(out) is int


def test_normalize_keeps_ints_and_expressions():
    assert normalize(7) == 7 and type(normalize(7)) is int
    assert normalize(2 * S0) == 2 * S0


@pytest.mark.parametrize("bad", [True, False, 2.0, "s0", None])
def test_normalize_rejects_non_dims(bad):
    with pytest.raises(TypeError, match="not a dimension"):
        normalize(bad)


def test_static_text_and_symbols():
    assert is_static(3) and is_static(sympy.Integer(3)) and not is_static(S0)
    assert dim_str(sympy.Integer(3)) == "3"
    assert dim_str(2 * S0 + 1) == "2*s0 + 1"
    assert dim_str(sympy.floor(S0 / 2)) == "floor(s0/2)"
    assert free_symbols(5) == set()
    assert free_symbols(S0 * S1 + 2) == {"s0", "s1"}


def test_symbol_is_a_positive_integer_and_interned():
    assert symbol("s0") == S0
    assert S0.is_integer and S0.is_positive
    # a plain sympy symbol has other assumptions, hence is another symbol: always use symbol()
    assert sympy.Symbol("s0") != S0


# -- equal ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b", [
    (3, 3),
    (sympy.Integer(3), 3),
    (S0 + S0, 2 * S0),
    (S0 * (S1 + 1), S0 * S1 + S0),
    (sympy.floor(2 * S0 / 2), S0),
    (sympy.Max(1, S0), S0),              # sizes are >= 1
    (sympy.ceiling(S0 / 1), S0),
    ((S0 + 1) ** 2, S0**2 + 2 * S0 + 1),
])
def test_equal_when_provably_the_same(a, b):
    assert equal(a, b) and equal(b, a)


@pytest.mark.parametrize("a, b", [
    (3, 4),
    (S0, 4),
    (S0, S1),
    (2 * S0, S0 + 1),
    (sympy.floor(S0 / 2), sympy.ceiling(S0 / 2)),
    (sympy.Max(2, S0), S0),              # differs at s0 = 1
])
def test_not_equal_when_not_provably_the_same(a, b):
    assert not equal(a, b) and not equal(b, a)


# -- evaluate -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim, bindings, want", [
    (5, {}, 5),
    (S0, {"s0": 7}, 7),
    (2 * S0 + 1, {"s0": 3}, 7),
    (sympy.floor(S0 / 2), {"s0": 5}, 2),
    (sympy.ceiling(S0 / 2), {"s0": 5}, 3),
    (sympy.Mod(S0, 3), {"s0": 8}, 2),
    (sympy.Max(1, S0 - 4), {"s0": 2}, 1),
    (sympy.Min(S0, S1), {"s0": 9, "s1": 4}, 4),
    (S0 * S1, {"s0": 3, "s1": 4, "unused": 100}, 12),
])
def test_evaluate(dim, bindings, want):
    got = evaluate(dim, bindings)
    assert got == want and type(got) is int


def test_evaluate_names_the_missing_symbols():
    with pytest.raises(KeyError, match=r"\['s1'\]"):
        evaluate(S0 + S1, {"s0": 1})


# -- upper_bound ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dim, ranges, want", [
    (8, {}, 8),
    (S0, {"s0": (1, 64)}, 64),
    (2 * S0 + 1, {"s0": (2, 10)}, 21),
    (S0 * S1, {"s0": (1, 4), "s1": (1, 8)}, 32),
    (sympy.floor(S0 / 2), {"s0": (1, 9)}, 4),
    (S0, {"s0": (1, None)}, None),           # unbounded range
    (S0 * S1, {"s0": (1, 4)}, None),         # s1 has no range at all
])
def test_upper_bound(dim, ranges, want):
    assert upper_bound(dim, ranges) == want


# -- product --------------------------------------------------------------------------------------
def test_product():
    assert product([]) == 1
    assert product([2, 3, sympy.Integer(4)]) == 24 and type(product([2, sympy.Integer(4)])) is int
    assert equal(product([S0, 2, S1]), 2 * S0 * S1)
    assert product([S0, 0]) == 0


# -- properties -----------------------------------------------------------------------------------
_LEAVES = st.one_of(st.integers(1, 9), st.sampled_from([S0, S1]))


def _floordiv(a, b: int):
    return sympy.floor(sympy.Integer(a) / b if isinstance(a, int) else a / b)


def _combine(children):
    pair = st.tuples(children, children)
    return st.one_of(
        pair.map(lambda p: p[0] + p[1]),
        pair.map(lambda p: p[0] * p[1]),
        st.tuples(children, st.integers(1, 4)).map(lambda p: _floordiv(*p)),
        pair.map(lambda p: sympy.Max(p[0], p[1])),
    )


DIMS = st.recursive(_LEAVES, _combine, max_leaves=6)
BINDINGS = st.fixed_dictionaries({"s0": st.integers(1, 50), "s1": st.integers(1, 50)})


@given(DIMS, DIMS, BINDINGS)
def test_product_evaluates_to_product_of_values(a, b, bindings):
    assert evaluate(product([a, b]), bindings) == evaluate(a, bindings) * evaluate(b, bindings)


@given(DIMS, BINDINGS)
def test_equal_dims_evaluate_equal(dim, bindings):
    rebuilt = sympy.expand(sympy.sympify(dim))
    assert equal(dim, rebuilt)
    assert evaluate(dim, bindings) == evaluate(rebuilt, bindings)


@given(DIMS, BINDINGS)
def test_upper_bound_bounds_every_value_in_range(dim, bindings):
    ranges = {"s0": (1, 50), "s1": (1, 50)}
    bound = upper_bound(dim, ranges)
    assert bound is not None
    assert evaluate(dim, bindings) <= bound
    assert bound == evaluate(dim, {"s0": 50, "s1": 50})
