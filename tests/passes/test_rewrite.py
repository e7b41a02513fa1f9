"""The pattern-rewrite mechanism: patterns, read-only matching with reasons, rules, the driver."""

from __future__ import annotations

from textwrap import dedent

import pytest

from compiler.ir import DType, parse_ir, print_ir, verify
from compiler.ir.ops import ShapeError
from passes.fusion.norms import RESIDUAL_RULES
from passes.rewrite import (
    MatchResult,
    OpBuilder,
    RewriteError,
    RuleSet,
    apply_rules,
    build_pattern,
    explain,
    match_pattern,
    rule,
)

SILU = rule("silu", lambda op, x: op.mul(x, op.sigmoid(x)), lambda op, x, **_: op.silu(x))


def graph_of(text: str):
    graph = parse_ir(dedent(text))
    verify(graph)
    return graph


def node(graph, name: str):
    return next(n for n in graph.nodes if n.outputs[0].name == name)


def test_unknown_op_in_a_pattern_fails_when_defined():
    with pytest.raises(ShapeError, match="unknown op 'sigmoidd'"):
        build_pattern(lambda op, x: op.sigmoidd(x))


def test_pattern_parameters_become_variables():
    root, params = build_pattern(lambda op, x, eps: op.add(op.exp(x), eps))
    assert params == ("x", "eps")
    assert root.op == "add" and root.inputs[0].op == "exp"


def test_matching_never_changes_the_graph():
    graph = graph_of("""
        graph main {
          input %x: f32[4]
          %s: f32[4] = sigmoid(%x)
          %m: f32[4] = mul(%s, %x)
          %t: f32[4] = tanh(%x)
          return %m, %t
        }
    """)
    before = print_ir(graph)
    assert SILU.match(graph, node(graph, "m"))  # operands swapped: mul is commutative
    assert not SILU.match(graph, node(graph, "t"))
    assert list(match_pattern(graph, SILU.pattern, node(graph, "m")))
    assert print_ir(graph) == before


def test_non_commutative_operands_are_not_swapped():
    swap = rule("sub_exp", lambda op, x, y: op.sub(op.exp(x), y), lambda op, x, y, **_: x)
    graph = graph_of("""
        graph main {
          input %x: f32[4]
          input %y: f32[4]
          %e: f32[4] = exp(%x)
          %a: f32[4] = sub(%e, %y)
          %f: f32[4] = exp(%x)
          %b: f32[4] = sub(%y, %f)
          return %a, %b
        }
    """)
    assert swap.match(graph, node(graph, "a"))
    result = swap.match(graph, node(graph, "b"))
    assert not result and result.reason == "%y is a graph input or weight, not exp"


def test_a_variable_used_twice_binds_one_value():
    double = rule("double", lambda op, x: op.add(x, x), lambda op, x, **_: x)
    graph = graph_of("""
        graph main {
          input %x: f32[4]
          input %y: f32[4]
          %a: f32[4] = add(%x, %x)
          %b: f32[4] = add(%x, %y)
          return %a, %b
        }
    """)
    assert double.match(graph, node(graph, "a")).bindings["x"].name == "x"
    reason = double.match(graph, node(graph, "b")).reason
    assert "should be the same value as %" in reason and "(both are 'x')" in reason


def test_a_shared_subpattern_must_be_one_node():
    def square_of_exp(op, x):
        e = op.exp(x)
        return op.mul(e, e)
    square = rule("square", square_of_exp, lambda op, x, **_: x)
    graph = graph_of("""
        graph main {
          input %x: f32[4]
          %e1: f32[4] = exp(%x)
          %e2: f32[4] = exp(%x)
          %same: f32[4] = mul(%e1, %e1)
          %diff: f32[4] = mul(%e1, %e2)
          return %same, %diff
        }
    """)
    same = next(match_pattern(graph, square.pattern, node(graph, "same")))
    diff = next(match_pattern(graph, square.pattern, node(graph, "diff")))
    assert same and [n.outputs[0].name for n in same.nodes] == ["same", "e1"]
    assert not diff and "should be the same value as %e1 (exp)" in diff.reason


def test_matching_looks_through_noop_views_casts_and_identities():
    graph = graph_of("""
        graph main {
          input %x: f32[2, 3]
          %c: f32[2, 3] = cast(%x) {dtype=f32}
          %r: f32[2, 3] = reshape(%c) {shape=[2, 3]}
          %one: f32[] = constant() {value=1.0, dtype=f32}
          %s: f32[2, 3] = sigmoid(%r)
          %s1: f32[2, 3] = mul(%s, %one)
          %m: f32[2, 3] = mul(%x, %s1)
          return %m
        }
    """)
    found = SILU.match(graph, node(graph, "m"))
    assert found and found.bindings["x"].name == "x"
    records = apply_rules(graph, RuleSet([SILU]))
    verify(graph)
    (silu,) = graph.nodes
    assert silu.op == "silu" and silu.inputs[0].name == "x" and silu.output.name == "m"
    assert silu.attrs["origin"] == ["%c cast", "%r reshape", "%s sigmoid", "%s1 mul", "%m mul"]
    assert [r.rule for r in records] == ["silu"]


def test_constants_match_by_value_and_bind_by_name():
    scale = rule("scale", lambda op, x: op.mul(x, op.const(name="c")),
                 lambda op, x, c, **_: op.mul(x, op.const(c * 2, x.dtype)))
    half = rule("half", lambda op, x: op.mul(x, 0.5), lambda op, x, **_: x)
    graph = graph_of("""
        graph main {
          input %x: f32[4]
          %i: i64[] = constant() {value=3, dtype=i64}
          %c: f32[] = cast(%i) {dtype=f32}
          %m: f32[4] = mul(%x, %c)
          return %m
        }
    """)
    assert scale.match(graph, node(graph, "m")).bindings["c"] == 3.0
    assert half.match(graph, node(graph, "m")).reason == \
        "%c (cast) is the constant 3.0, the pattern needs 0.5"


def test_attribute_constraints_and_captures():
    sums = rule("sum_last", lambda op, x: op.sum(x, dims=op.capture("dims"), keepdim=True),
                lambda op, x, **_: x)
    graph = graph_of("""
        graph main {
          input %x: f32[2, 3]
          %a: f32[2, 1] = sum(%x) {dims=[1], keepdim=true}
          %b: f32[2] = sum(%x) {dims=[1], keepdim=false}
          return %a, %b
        }
    """)
    assert sums.match(graph, node(graph, "a")).bindings["dims"] == [1]
    assert sums.match(graph, node(graph, "b")).reason == \
        "%b (sum): attribute keepdim is False, the pattern needs True"


def test_check_rejects_with_its_reason():
    only_f64 = rule("silu64", lambda op, x: op.mul(x, op.sigmoid(x)), lambda op, x, **_: op.silu(x),
                    check=lambda ctx, x, **_: None if x.dtype.value == "f64"
                    else MatchResult.fail(f"%{x.name} is {x.dtype}, not f64"))
    graph = graph_of("""
        graph main {
          input %x: f32[4]
          %s: f32[4] = sigmoid(%x)
          %m: f32[4] = mul(%x, %s)
          return %m
        }
    """)
    assert explain(graph, "%m", RuleSet([only_f64, SILU])) == [
        ("silu64", "%x is f32, not f64"), ("silu", "matches")]


def test_rule_sets_compose_and_reject_duplicate_names():
    other = rule("exp_log", lambda op, x: op.exp(op.log(x)), lambda op, x, **_: x)
    both = RuleSet([SILU], "a") + RuleSet([other], "b")
    assert both.names == ["silu", "exp_log"] and both.name == "a+b"
    assert both.for_op("exp") == [other] and both.for_op("mul") == [SILU]
    with pytest.raises(ValueError, match="silu"):
        RuleSet([SILU]) + RuleSet([SILU])


def test_driver_reaches_a_fixpoint_building_on_its_own_results():
    collapse = rule("neg_neg", lambda op, x: op.neg(op.neg(x)), lambda op, x, **_: op.abs(x))
    graph = graph_of("""
        graph main {
          input %x: f32[4]
          %a: f32[4] = neg(%x)
          %b: f32[4] = neg(%a)
          %c: f32[4] = neg(%b)
          %d: f32[4] = neg(%c)
          return %d
        }
    """)
    records = apply_rules(graph, RuleSet([collapse]))
    verify(graph)
    assert print_ir(graph).splitlines()[2:4] == [
        '  %b: f32[4] = abs(%x) {origin=["%a neg", "%b neg"]}',
        '  %d: f32[4] = abs(%b) {origin=["%c neg", "%d neg"]}']
    assert [(r.rule, r.anchor) for r in records] == [("neg_neg", "%b neg"), ("neg_neg", "%d neg")]
    assert apply_rules(graph, RuleSet([collapse])) == []


def test_a_rewrite_that_changes_the_type_is_a_rule_bug():
    graph = graph_of("""
        graph main {
          input %x: f32[4]
          %e: f32[4] = exp(%x)
          return %e
        }
    """)
    bad = rule("bad", lambda op, x: op.exp(x), lambda op, x, **_: op.cast(x, dtype=DType.f64))
    with pytest.raises(RewriteError, match="rule bad replaced %e"):
        apply_rules(graph, RuleSet([bad]))


def test_replaced_values_read_before_the_root_keep_the_order_topological():
    graph = graph_of("""
        graph main {
          input %a: f32[2, 8]
          input %b: f32[2, 8]
          %sum: f32[2, 8] = add(%a, %b)
          %early: f32[2, 8] = neg(%sum)
          %n: f32[2, 8] = rms_norm(%sum, _) {normalized_shape=[8]}
          return %n, %early
        }
    """)
    apply_rules(graph, RESIDUAL_RULES)
    verify(graph)
    fused, early = graph.nodes
    assert fused.op == "add_rms_norm" and [v.name for v in fused.outputs] == ["n", "sum"]
    assert early.op == "neg" and early.inputs[0] is fused.outputs[1]
    assert fused.attrs["origin"] == ["%sum add", "%n rms_norm"]


def test_op_builder_helpers():
    op = OpBuilder()
    assert op.variable("w").name == "w"
    assert op.const(2.0).value == 2.0
    optional = op.optional("cast", op.variable("x"))
    assert optional.alternatives[0].op == "cast" and optional.alternatives[1].name == "x"
