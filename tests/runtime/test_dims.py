"""Manifest dim strings evaluate like sympy does, and anything that is not arithmetic is refused."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from compiler.errors import ArtifactError
from compiler.ir import symbolic
from runtime.dims import dim_symbols, eval_dim

S0, S1 = symbolic.symbol("s0"), symbolic.symbol("s1")


@pytest.mark.parametrize("text, expected", [
    ("s0", 6), ("2*s0", 12), ("s0 + s1", 10), ("floor(s0/4)", 1), ("ceiling(s0/4)", 2),
    ("Max(1, s0 - 9)", 1), ("Min(s0, s1)", 4), ("s0**2", 36), ("Mod(s0, 4)", 2), ("-s0 + 7", 1),
    ("s0//4", 1), ("7", 7),
])
def test_eval(text, expected):
    assert eval_dim(text, {"s0": 6, "s1": 4}) == expected


def test_symbols():
    assert dim_symbols("floor(s0/2) + Max(s1, 3)") == {"s0", "s1"}
    assert dim_symbols("8") == set()


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "s0.real", "lambda: 1", "[1]", "'s0'", "s0 if s1 else 2",
    "open(s0)", "1.5", "s0 +", "floor(s0, key=1)",
])
def test_refuses_anything_else(text):
    with pytest.raises(ArtifactError, match="is not a size expression"):
        eval_dim(text, {"s0": 1, "s1": 1})


def test_huge_powers_are_refused():
    with pytest.raises(ArtifactError, match="unsupported power"):
        eval_dim("s0**100000000", {"s0": 2})


_leaf = st.sampled_from([S0, S1, sympy.Integer(2), sympy.Integer(3)])
_expr = st.recursive(_leaf, lambda sub: st.one_of(
    st.tuples(sub, sub).map(lambda p: p[0] + p[1]),
    st.tuples(sub, sub).map(lambda p: p[0] * p[1]),
    st.tuples(sub, _leaf).map(lambda p: sympy.floor(p[0] / p[1])),  # sizes divide by positives
    st.tuples(sub, sub).map(lambda p: sympy.Max(p[0], p[1])),
    st.tuples(sub, _leaf).map(lambda p: sympy.Mod(p[0], p[1]))), max_leaves=6)


@given(_expr, st.integers(1, 50), st.integers(1, 50))
def test_agrees_with_sympy(expr, s0, s1):
    text = symbolic.dim_str(expr)
    assert eval_dim(text, {"s0": s0, "s1": s1}) == symbolic.evaluate(expr, {"s0": s0, "s1": s1})
