from __future__ import annotations

from textwrap import dedent

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from backends.reference.interpreter import run_graph
from compiler.ir import parse_ir, print_ir, verify
from passes import parse_pipeline
from passes.remove_noops import RULES

NOOPS = """
    graph main {
      symbol s0 in [1, 16]
      input %x: f32[s0, 4]
      input %y: f32[2, 6]
      %r: f32[s0, 4] = reshape(%x) {shape=[s0, 4]}
      %p: f32[s0, 4] = permute(%r) {dims=[0, -1]}
      %e: f32[s0, 4] = expand(%p) {shape=[s0, -1]}
      %c: f32[s0, 4] = cast(%e) {dtype=f32}
      %s: f32[s0, 4] = slice(%c) {dim=1, start=0, end=9223372036854775807, step=1}
      %k: f32[s0, 4] = concat(%s) {dim=0}
      %o: f32[s0, 4] = relu(%k)
      %t: f32[6, 2] = permute(%y) {dims=[1, 0]}
      %h: f32[2, 3] = slice(%y) {dim=1, start=0, end=3, step=1}
      %g: f32[2, 3] = slice(%y) {dim=1, start=0, end=6, step=2}
      %i: i64[2, 6] = cast(%y) {dtype=i64}
      %j: f32[4, 6] = concat(%y, %y) {dim=0}
      %one: f32[] = constant() {value=1.0, dtype=f32}
      %two: f32[] = constant() {value=2.0, dtype=f32}
      %m: f32[2, 6] = mul(%one, %y)
      %d: f32[2, 6] = div(%m, %one)
      %f: f32[2, 6] = div(%y, %one) {rounding_mode="floor"}
      %w: f32[2, 6] = mul(%y, %two)
      return %o, %t, %h, %g, %i, %j, %d, %f, %w
    }
"""


def test_every_rule_removes_its_noop_and_keeps_real_ops(run_pass):
    result = run_pass(NOOPS, "remove_noops")
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          symbol s0 in [1, 16]
          input %x: f32[s0, 4]
          input %y: f32[2, 6]
          %o: f32[s0, 4] = relu(%x)
          %t: f32[6, 2] = permute(%y) {dims=[1, 0]}
          %h: f32[2, 3] = slice(%y) {dim=1, start=0, end=3, step=1}
          %g: f32[2, 3] = slice(%y) {dim=1, start=0, end=6, step=2}
          %i: i64[2, 6] = cast(%y) {dtype=i64}
          %j: f32[4, 6] = concat(%y, %y) {dim=0}
          %one: f32[] = constant() {value=1.0, dtype=f32}
          %two: f32[] = constant() {value=2.0, dtype=f32}
          %f: f32[2, 6] = div(%y, %one) {rounding_mode="floor"}
          %w: f32[2, 6] = mul(%y, %two)
          return %o, %t, %h, %g, %i, %j, %y, %f, %w
        }
        """)
    assert run_pass(print_ir(result.graph), "remove_noops").changed is False


def test_rules_are_a_table_over_real_ops():
    from compiler.ir import OPS

    assert set(RULES) == {"reshape", "permute", "expand", "cast", "slice", "concat", "mul",
                          "div"}
    assert set(RULES) <= set(OPS)


def test_reshape_chain_collapses_into_one_reshape(run_pass):
    text = """
        graph main {
          input %x: f32[2, 6]
          %a: f32[3, 4] = reshape(%x) {shape=[3, 4]}
          %b: f32[4, 3] = reshape(%a) {shape=[4, 3]}
          %c: f32[12] = reshape(%b) {shape=[-1]}
          return %c
        }
    """
    result = run_pass(text, "remove_noops")
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[2, 6]
          %c: f32[12] = reshape(%x) {shape=[-1]}
          return %c
        }
        """)


def test_reshape_chain_keeps_inner_reshape_that_has_other_users(run_pass):
    text = """
        graph main {
          input %x: f32[2, 6]
          %a: f32[3, 4] = reshape(%x) {shape=[3, 4]}
          %b: f32[12] = reshape(%a) {shape=[12]}
          %n: f32[3, 4] = neg(%a)
          return %b, %n
        }
    """
    result = run_pass(text, "remove_noops")
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[2, 6]
          %a: f32[3, 4] = reshape(%x) {shape=[3, 4]}
          %b: f32[12] = reshape(%x) {shape=[12]}
          %n: f32[3, 4] = neg(%a)
          return %b, %n
        }
        """)


def test_reshape_there_and_back_disappears_and_output_is_rewired(run_pass):
    text = """
        graph main {
          input %x: f32[2, 6]
          %d: f32[2, 6] = exp(%x)
          %a: f32[12] = reshape(%d) {shape=[12]}
          %b: f32[2, 6] = reshape(%a) {shape=[2, 6]}
          return %b, %a
        }
    """
    result = run_pass(text, "remove_noops")
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[2, 6]
          %d: f32[2, 6] = exp(%x)
          %a: f32[12] = reshape(%d) {shape=[12]}
          return %d, %a
        }
        """)


def test_noop_on_graph_input_returned_directly(run_pass):
    text = """
        graph main {
          input %x: f32[3]
          %c: f32[3] = cast(%x) {dtype=f32}
          return %c
        }
    """
    result = run_pass(text, "remove_noops")
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[3]
          return %x
        }
        """)


def test_pre_existing_dead_code_is_left_alone(run_pass):
    text = """
        graph main {
          input %x: f32[3]
          %dead: f32[3] = exp(%x)
          %o: f32[3] = neg(%x)
          return %o
        }
    """
    result = run_pass(text, "remove_noops")
    assert result.changed is False
    assert print_ir(result.graph) == dedent(text).lstrip("\n")


def _factorizations(n: int) -> list[list[int]]:
    shapes = [[n]]
    for a in range(2, n):
        if n % a == 0:
            shapes += [[a] + rest for rest in _factorizations(n // a)]
    return shapes


@given(st.lists(st.sampled_from(_factorizations(24)), min_size=1, max_size=6),
       st.booleans())
def test_random_reshape_chains_keep_values(shapes, return_middle):
    lines = ["graph main {", "  input %x: f32[4, 6]"]
    prev, prev_shape = "%x", [4, 6]
    for i, shape in enumerate(shapes):
        dims = ", ".join(map(str, shape))
        lines.append(f"  %r{i}: f32[{dims}] = reshape({prev}) {{shape=[{dims}]}}")
        prev, prev_shape = f"%r{i}", shape
    lines.append(f"  %out: f32[{', '.join(map(str, prev_shape))}] = neg({prev})")
    returned = ["%out"] + ([f"%r{len(shapes) // 2}"] if return_middle else [])
    lines += ["  return " + ", ".join(returned), "}"]
    text = "\n".join(lines) + "\n"
    x = torch.randn(4, 6)
    expected = run_graph(parse_ir(text), {}, [x])
    (pass_,) = parse_pipeline("remove_noops")
    graph = pass_.run(parse_ir(text)).graph
    verify(graph)
    reshapes = [n for n in graph.nodes if n.op == "reshape"]
    assert len(reshapes) <= 1 + return_middle
    assert all(n.inputs[0].name == "x" for n in reshapes)
    for got, want in zip(run_graph(graph, {}, [x]), expected):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dims,removed", [([0, 1, 2], True), ([-3, -2, -1], True),
                                          ([0, 2, 1], False)])
def test_permute_identity_detection(run_pass, dims, removed):
    shape = [[2, 3, 4][d] for d in dims]
    text = f"""
        graph main {{
          input %x: f32[2, 3, 4]
          %p: f32[{', '.join(map(str, shape))}] = permute(%x) {{dims={dims}}}
          return %p
        }}
    """
    result = run_pass(text, "remove_noops")
    assert result.changed is removed
    assert ("permute" not in print_ir(result.graph)) is removed


def test_slice_to_symbolic_end_is_whole_dim(run_pass):
    text = """
        graph main {
          symbol s0 in [1, 16]
          input %x: f32[s0, 4]
          %s: f32[s0, 4] = slice(%x) {dim=0, start=0, end=s0, step=1}
          %t: f32[s0 - 1, 4] = slice(%x) {dim=0, start=1, end=s0, step=1}
          %o: f32[s0, 4] = exp(%s)
          return %o, %t
        }
    """
    result = run_pass(text, "remove_noops")
    assert print_ir(result.graph) == dedent("""\
        graph main {
          symbol s0 in [1, 16]
          input %x: f32[s0, 4]
          %t: f32[s0 - 1, 4] = slice(%x) {dim=0, start=1, end=s0, step=1}
          %o: f32[s0, 4] = exp(%x)
          return %o, %t
        }
        """)
    x = torch.randn(5, 4)
    expected = run_graph(parse_ir(dedent(text)), {}, [x])
    for got, want in zip(run_graph(result.graph, {}, [x]), expected):
        assert torch.equal(got, want)


def test_concat_with_empty_operands_is_its_one_nonempty_operand(run_pass):
    """Phi-3's rotary: the rotated head concatenated with a pass-through slice of size 0."""
    text = """
        graph main {
          symbol s0 in [1, 16]
          input %x: f32[1, 4, s0, 16]
          %rot: f32[1, 4, s0, 16] = neg(%x)
          %pass: f32[1, 4, s0, 0] = slice(%x) {dim=3, start=16, end=16, step=1}
          %cat: f32[1, 4, s0, 16] = concat(%rot, %pass) {dim=3}
          %two: f32[1, 4, s0, 16] = concat(%pass, %rot, %pass) {dim=-1}
          %both: f32[1, 4, s0, 32] = concat(%rot, %pass, %rot) {dim=3}
          return %cat, %two, %both
        }
    """
    result = run_pass(text, "remove_noops")
    assert result.changed is True
    graph = result.graph
    assert [n.op for n in graph.nodes] == ["neg", "slice", "concat"]
    assert graph.outputs[0] is graph.outputs[1] is graph.nodes[0].outputs[0]


def test_slice_taking_back_one_concat_operand_is_that_operand(run_pass):
    """DeepSeek's key: `new_empty` with both halves assigned, functionalized into
    concat(a, slice(full)) then concat(slice(.., :dn), b); the re-read half is `a` itself."""
    text = """
        graph main {
          symbol s0 in [1, 16]
          input %a: f32[s0, 3]
          input %b: f32[s0, 2]
          %z: f32[s0, 5] = full() {shape=[s0, 5], value=0.0, dtype=f32}
          %zs: f32[s0, 2] = slice(%z) {dim=1, start=3, end=5, step=1}
          %c: f32[s0, 5] = concat(%a, %zs) {dim=1}
          %ca: f32[s0, 3] = slice(%c) {dim=-1, start=0, end=3, step=1}
          %mid: f32[s0, 2] = slice(%c) {dim=1, start=1, end=3, step=1}
          %k: f32[s0, 5] = concat(%ca, %b) {dim=1}
          return %k, %mid
        }
    """
    result = run_pass(text, "remove_noops")
    assert print_ir(result.graph) == dedent("""\
        graph main {
          symbol s0 in [1, 16]
          input %a: f32[s0, 3]
          input %b: f32[s0, 2]
          %z: f32[s0, 5] = full() {shape=[s0, 5], value=0.0, dtype=f32}
          %zs: f32[s0, 2] = slice(%z) {dim=1, start=3, end=5, step=1}
          %c: f32[s0, 5] = concat(%a, %zs) {dim=1}
          %mid: f32[s0, 2] = slice(%c) {dim=1, start=1, end=3, step=1}
          %k: f32[s0, 5] = concat(%a, %b) {dim=1}
          return %k, %mid
        }
        """)
