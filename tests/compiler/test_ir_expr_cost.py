"""The work one size expression can cost is bounded by counts, never by a clock (issue 33).

IR text with 16-argument `Max(...)` dims cost about 6 s of CPU per 290-byte dim: sympy compares
every pair of a Max's arguments when it builds one (and again whenever it rebuilds it, in `subs`
and in a shape rule's ceiling), each comparison milliseconds of assumption queries. Now the
parser builds Max/Min without comparisons, refuses more than MAX_EXTREMA_ARGS distinct
arguments, MAX_EXTREMA_PAIRS pairs or MAX_EXTREMA_NODES nodes, evaluates dims by one counted
walk instead of `subs`, and hands sympy.simplify only small differences. These tests count the
expensive sympy calls instead of timing them."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import sympy
from sympy.functions.elementary.miscellaneous import MinMaxBase

from compiler.errors import IRParseError
from compiler.ir import parse_ir, print_ir, symbolic
from compiler.ir.limits import (
    MAX_EXTREMA_ARGS,
    MAX_EXTREMA_NODES,
    MAX_EXTREMA_PAIRS,
    MAX_SIMPLIFY_CALLS,
    MAX_SIMPLIFY_NODES,
)
from compiler.ir.symbolic import symbol

S = [symbol(f"s{i}") for i in range(8)]


@pytest.fixture
def sympy_calls(monkeypatch) -> Counter:
    """Counts of sympy's expensive operations: Max/Min's pairwise comparisons, subs and
    simplify (with the node count of the largest expression simplify was given)."""
    calls: Counter = Counter()
    connected, subs, simplify = MinMaxBase._is_connected.__func__, sympy.Basic.subs, \
        sympy.simplify

    def count_connected(cls, x, y):
        calls["compare"] += 1
        return connected(cls, x, y)

    def count_subs(self, *args, **kwargs):
        calls["subs"] += 1
        return subs(self, *args, **kwargs)

    def count_simplify(expr, *args, **kwargs):
        calls["simplify"] += 1
        calls["simplify_nodes"] = max(calls["simplify_nodes"],
                                      symbolic.node_count(expr, 10**6))
        return simplify(expr, *args, **kwargs)

    monkeypatch.setattr(MinMaxBase, "_is_connected", classmethod(count_connected))
    monkeypatch.setattr(sympy.Basic, "subs", count_subs)
    monkeypatch.setattr(sympy, "simplify", count_simplify)
    return calls


def _graph(dims: list[str], symbols: int = 8) -> str:
    lines = [f"  symbol s{i} in [1, 64]" for i in range(symbols)]
    lines += [f"  input %x{i}: f32[{d}]" for i, d in enumerate(dims)]
    lines.append("  return " + ", ".join(f"%x{i}" for i in range(len(dims))))
    return "graph t {\n" + "\n".join(lines) + "\n}\n"


def _poly(i: int, k: int) -> str:
    return f"s{(k + i) % 8}*s{(k + 2 * i + 1) % 8} - {7 * i + k + 10}*s{(i + k + 3) % 8} + 1"


# The issue's case: 16-argument Max dims of ~290 bytes, five of them in a 1.6 KB file.
WIDE = [f"Max({', '.join(_poly(i, k) for i in range(16))})" for k in range(5)]


def test_the_16_argument_max_of_the_issue_is_refused_by_count(sympy_calls):
    text = _graph(WIDE)
    assert 1600 < len(text) < 2000 and all(280 < len(d) < 320 for d in WIDE)
    with pytest.raises(IRParseError) as info:
        parse_ir(text, "wide.dzir")
    err = info.value
    assert f"Max has 16 distinct arguments (at most {MAX_EXTREMA_ARGS})" in err.what
    assert err.where == "wide.dzir: line 10, column 18"  # the first Max, in %x0's type
    assert sympy_calls["compare"] == 0 and sympy_calls["subs"] == 0


def test_a_max_within_the_limits_parses_without_a_comparison(sympy_calls):
    dims = ["Max(s0*s1 - 7, s2 + 3, Mod(s3, 5)*s4, floor(s5/3))", "Min(s0, 8) + Max(1, s1 - 9)"]
    graph = parse_ir(_graph(dims))
    assert [str(v.type) for v in graph.inputs] == [
        "f32[Max(s4*(Mod(s3, 5)), s2 + 3, s0*s1 - 7, floor(s5/3))]",
        "f32[Max(1, s1 - 9) + Min(8, s0)]"]
    assert print_ir(parse_ir(print_ir(graph))) == print_ir(graph)
    assert sympy_calls["compare"] == 0
    assert symbolic.evaluate(graph.inputs[0].type.shape[0], {f"s{i}": i + 2 for i in range(8)}) \
        == max(2 * 3 - 7, 4 + 3, (5 % 5) * 6, 7 // 3)


@pytest.mark.parametrize("dim, what", [
    (f"Max({', '.join(f's{i}' for i in range(MAX_EXTREMA_ARGS + 1))})",
     f"Max has {MAX_EXTREMA_ARGS + 1} distinct arguments"),
    ("Max(s0, Max(s1, s2), Max(s3, s4))", "Max has 5 distinct arguments"),  # flattened
    (" + ".join(f"Min(s{i}, {i + 1})" for i in range(MAX_EXTREMA_PAIRS + 1)),
     f"more than {MAX_EXTREMA_PAIRS} pairs of arguments"),
    ("Max(s0*s1*s2*s3 + s4*s5*s6*s7 + 1, s0*s2*s4*s6 + s1*s3*s5*s7 + 1)",
     f"more than {MAX_EXTREMA_NODES} terms and operations"),
])
def test_max_and_min_past_the_limits_are_refused_at_their_position(dim, what, sympy_calls):
    with pytest.raises(IRParseError) as info:
        parse_ir(_graph(["s0", dim]), "big.dzir")
    assert what in info.value.what, info.value.message()
    assert re.fullmatch(r"big\.dzir: line 11, column \d+", info.value.where)
    assert sympy_calls["compare"] == 0


def test_duplicate_and_constant_arguments_fold_without_comparisons(sympy_calls):
    """Max(3, 5, s0, s0) is Max(5, s0): constants fold, duplicates go, nested Max flatten."""
    graph = parse_ir(_graph(["Max(3, 5, s0, s0, 2)", "Min(Min(s0, s1), s1, 9, 7)"], 2))
    assert [str(v.type) for v in graph.inputs] == ["f32[Max(5, s0)]", "f32[Min(7, s0, s1)]"]
    assert sympy_calls["compare"] == 0


def test_evaluate_walks_the_tree_once_instead_of_subs(sympy_calls):
    wide = sympy.Max(*(S[i % 8] * S[(i + 3) % 8] - i for i in range(16)), evaluate=False)
    values = {f"s{i}": i + 1 for i in range(8)}
    assert symbolic.evaluate(wide, values) == max(
        (i % 8 + 1) * ((i + 3) % 8 + 1) - i for i in range(16))
    assert sympy_calls["subs"] == 0 and sympy_calls["compare"] == 0


def test_exact_evaluation_is_counted():
    expr = sum(S[i % 8] * S[(i + 1) % 8] for i in range(40))
    values = {f"s{i}": 2 for i in range(8)}
    assert symbolic.exact_value(expr, values) == 160
    with pytest.raises(ValueError, match="evaluation steps"):
        symbolic.exact_value(expr, values, max_steps=20)
    with pytest.raises(ValueError, match="bits"):
        symbolic.exact_value(S[0] ** 5000, {"s0": 3})
    with pytest.raises(ZeroDivisionError):
        symbolic.exact_value(sympy.Mod(S[0], S[1] - 2, evaluate=False), {"s0": 3, "s1": 2})


def test_simplify_sees_only_small_differences(sympy_calls):
    """Two dims no probe tells apart but that differ in form: a small difference is proven
    zero (by expand, else simplify); a large one is not handed to sympy (and counts as
    unproven)."""
    assert symbolic.equal((S[0] + 1) ** 2, S[0] ** 2 + 2 * S[0] + 1)  # expand proves it
    assert sympy_calls["simplify"] == 0
    assert symbolic.equal(sympy.Max(1, S[0], evaluate=False), S[0])  # simplify proves it
    assert sympy_calls["simplify"] == 1
    big = sympy.Mul(*(S[i] + i for i in range(8)), evaluate=False)
    assert symbolic.node_count(big - sympy.expand(big), 10**6) > MAX_SIMPLIFY_NODES
    assert not symbolic.equal(big, sympy.expand(big))
    assert sympy_calls["simplify"] == 1 and sympy_calls["simplify_nodes"] <= MAX_SIMPLIFY_NODES


def test_a_parse_asks_sympy_for_a_bounded_number_of_proofs(sympy_calls):
    """Each node's declared type equals the inferred one only by simplify (Max(1, s0) is s0):
    a parse pays for MAX_SIMPLIFY_CALLS such proofs, then refuses the next at its line."""
    lines = ["  symbol s0 in [1, 64]", "  input %x0: f32[s0]"]
    lines += [f"  %x{i + 1}: f32[{'Max(1, s0)' if i % 2 == 0 else 's0'}] = neg(%x{i})"
              for i in range(MAX_SIMPLIFY_CALLS + 4)]
    text = "graph t {\n" + "\n".join(lines) + f"\n  return %x{MAX_SIMPLIFY_CALLS + 4}\n}}\n"
    with pytest.raises(IRParseError) as info:
        parse_ir(text, "proofs.dzir")
    assert "is declared" in info.value.what and "but neg gives" in info.value.what
    assert info.value.where == f"proofs.dzir: line {MAX_SIMPLIFY_CALLS + 4}, column 3"
    assert sympy_calls["simplify"] == MAX_SIMPLIFY_CALLS
    with symbolic.bounded_simplify(0):
        assert not symbolic.equal(sympy.Max(1, S[0], evaluate=False), S[0])
    assert symbolic.equal(sympy.Max(1, S[0], evaluate=False), S[0])  # no bound outside


@pytest.mark.parametrize("dim, what", [
    ("floor(Max(ceiling(s0/3), floor(s0/Min(s0, 0)))/7)", "divides by zero at both ends"),
    ("Mod(s0, Min(s0, 0)) + s0", "is not an integer"),
])
def test_a_dim_that_hides_a_division_by_zero_is_refused(dim, what):
    """Min(s0, 0) is 0 for sizes; unevaluated it hid a division by zero from the parser until
    a shape rule's sympy call met `zoo` (a fuzzed case), or sympy's Mod raised
    ZeroDivisionError out of the parser."""
    with pytest.raises(IRParseError) as info:
        parse_ir(_graph([dim], 1), "zero.dzir")
    assert what in info.value.what
    assert info.value.where == "zero.dzir: line 3, column 18"
