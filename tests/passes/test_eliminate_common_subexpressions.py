from __future__ import annotations

from textwrap import dedent

import torch

from backends.reference.interpreter import run_graph
from compiler.ir import parse_ir, print_ir

CSE = "eliminate_common_subexpressions"


def test_merges_duplicates_and_chains(run_pass):
    text = """
        graph main {
          input %x: f32[2, 3]
          input %y: f32[2, 3]
          %a1: f32[2, 3] = add(%x, %y)
          %a2: f32[2, 3] = add(%x, %y)
          %b1: f32[2, 3] = relu(%a1)
          %b2: f32[2, 3] = relu(%a2)
          %c: f32[2, 3] = mul(%b1, %b2)
          return %c, %b2
        }
    """
    result = run_pass(text, CSE)
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[2, 3]
          input %y: f32[2, 3]
          %a1: f32[2, 3] = add(%x, %y)
          %b1: f32[2, 3] = relu(%a1)
          %c: f32[2, 3] = mul(%b1, %b1)
          return %c, %b1
        }
        """)
    assert run_pass(print_ir(result.graph), CSE).changed is False


def test_commutative_operands_merge_but_not_others(run_pass):
    text = """
        graph main {
          input %x: f32[3]
          input %y: f32[3]
          %m1: f32[3] = mul(%x, %y)
          %m2: f32[3] = mul(%y, %x)
          %s1: f32[3] = sub(%x, %y)
          %s2: f32[3] = sub(%y, %x)
          %l1: bool[3] = lt(%x, %y)
          %l2: bool[3] = lt(%y, %x)
          %e1: bool[3] = eq(%x, %y)
          %e2: bool[3] = eq(%y, %x)
          return %m1, %m2, %s1, %s2, %l1, %l2, %e1, %e2
        }
    """
    result = run_pass(text, CSE)
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[3]
          input %y: f32[3]
          %m1: f32[3] = mul(%x, %y)
          %s1: f32[3] = sub(%x, %y)
          %s2: f32[3] = sub(%y, %x)
          %l1: bool[3] = lt(%x, %y)
          %l2: bool[3] = lt(%y, %x)
          %e1: bool[3] = eq(%x, %y)
          return %m1, %m1, %s1, %s2, %l1, %l2, %e1, %e1
        }
        """)


def test_constants_merge_only_when_attributes_print_the_same(run_pass):
    text = """
        graph main {
          input %x: f32[3]
          %c1: f32[] = constant() {value=2.0, dtype=f32}
          %c2: f32[] = constant() {value=2.0, dtype=f32}
          %c3: f32[] = constant() {value=2.0, dtype=f16}
          %z1: f32[] = constant() {value=0.0, dtype=f32}
          %z2: f32[] = constant() {value=-0.0, dtype=f32}
          %i1: f32[] = constant() {value=1, dtype=f32}
          %i2: f32[] = constant() {value=1.0, dtype=f32}
          %f1: f32[2] = full() {shape=[2], value=1.0, dtype=f32}
          %f2: f32[2] = full() {shape=[2], value=1.0, dtype=f32}
          %a: f32[3] = mul(%x, %c1)
          %b: f32[3] = mul(%x, %c2)
          return %a, %b, %c3, %z1, %z2, %i1, %i2, %f1, %f2
        }
    """.replace("%c3: f32[]", "%c3: f16[]")
    result = run_pass(text, CSE)
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[3]
          %c1: f32[] = constant() {value=2.0, dtype=f32}
          %c3: f16[] = constant() {value=2.0, dtype=f16}
          %z1: f32[] = constant() {value=0.0, dtype=f32}
          %z2: f32[] = constant() {value=-0.0, dtype=f32}
          %i1: f32[] = constant() {value=1, dtype=f32}
          %i2: f32[] = constant() {value=1.0, dtype=f32}
          %f1: f32[2] = full() {shape=[2], value=1.0, dtype=f32}
          %a: f32[3] = mul(%x, %c1)
          return %a, %a, %c3, %z1, %z2, %i1, %i2, %f1, %f1
        }
        """)


def test_different_attributes_or_weights_do_not_merge(run_pass):
    text = """
        graph main {
          input %x: f32[4, 6]
          weight @w1: f32[6]
          weight @w2: f32[6]
          %s1: f32[4] = sum(%x) {dims=[1], keepdim=false}
          %s2: f32[6] = sum(%x) {dims=[0], keepdim=false}
          %a1: f32[4, 6] = add(%x, @w1)
          %a2: f32[4, 6] = add(%x, @w2)
          %a3: f32[4, 6] = add(@w1, %x)
          return %s1, %s2, %a1, %a2, %a3
        }
    """
    result = run_pass(text, CSE)
    assert result.changed is True
    out = print_ir(result.graph)
    assert "%a3" not in out and out.endswith("return %s1, %s2, %a1, %a2, %a1\n}\n")
    assert "%s2: f32[6] = sum" in out and "%a2" in out


def test_unchanged_graph_is_reported_unchanged(run_pass):
    text = """
        graph main {
          input %x: f32[3]
          %a: f32[3] = exp(%x)
          %b: f32[3] = neg(%a)
          return %b
        }
    """
    result = run_pass(text, CSE)
    assert result.changed is False
    assert print_ir(result.graph) == dedent(text).lstrip("\n")


def test_numerics_unchanged():
    text = dedent("""
        graph main {
          input %x: f32[4, 8]
          weight @w: f32[8, 8]
          %h1: f32[4, 8] = matmul(%x, @w)
          %h2: f32[4, 8] = matmul(%x, @w)
          %s1: f32[4, 8] = softmax(%h1) {dim=-1}
          %s2: f32[4, 8] = softmax(%h2) {dim=-1}
          %o: f32[4, 8] = add(%s1, %s2)
          return %o
        }
    """)
    from passes import parse_pipeline

    weights = {"w": torch.randn(8, 8)}
    x = torch.randn(4, 8)
    (expected,) = run_graph(parse_ir(text), weights, [x])
    (pass_,) = parse_pipeline(CSE)
    graph = pass_.run(parse_ir(text)).graph
    assert len(graph.nodes) == 3
    (got,) = run_graph(graph, weights, [x])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
