from __future__ import annotations

from textwrap import dedent

import pytest
import torch

from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.ir import parse_ir, print_ir, verify
from passes import parse_pipeline


def fold(text: str, weights: dict, spec: str = "fold_constants"):
    graph = parse_ir(dedent(text))
    graph.weight_data.update(weights)
    (pass_,) = parse_pipeline(spec)
    result = pass_.run(graph)
    verify(result.graph)
    return result


def assert_same_values(text: str, weights: dict, inputs: list, spec: str = "fold_constants"):
    """The folded graph computes what the unfolded one computes (reference interpreter)."""
    expected = run_graph(parse_ir(dedent(text)), weights, inputs)
    result = fold(text, weights, spec)
    got = run_graph(result.graph, result.graph.weight_data, inputs)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    return result


TRANSPOSED = """
    graph main {
      input %x: f32[2, 4]
      weight @w: f32[3, 4]
      %wt: f32[4, 3] = permute(@w) {dims=[1, 0]}
      %two: f32[] = constant() {value=2.0, dtype=f32}
      %ws: f32[4, 3] = mul(%wt, %two)
      %y: f32[2, 3] = matmul(%x, %ws)
      return %y
    }
"""


def test_folds_weight_chain_into_one_new_weight():
    w = torch.randn(3, 4)
    result = fold(TRANSPOSED, {"w": w})
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[2, 4]
          weight @w: f32[3, 4]
          weight @folded.ws: f32[4, 3]
          %two: f32[] = constant() {value=2.0, dtype=f32}
          %y: f32[2, 3] = matmul(%x, @folded.ws)
          return %y
        }
        """)
    assert torch.equal(result.graph.weight_data["folded.ws"], w.t() * 2)
    assert result.graph.weight_data["folded.ws"].is_contiguous()


def test_folded_graph_computes_the_same_and_second_run_is_unchanged():
    weights = {"w": torch.randn(3, 4)}
    result = assert_same_values(TRANSPOSED, weights, [torch.randn(2, 4)])
    (pass_,) = parse_pipeline("fold_constants")
    assert pass_.run(result.graph).changed is False


def test_weights_without_data_are_not_constants():
    result = fold(TRANSPOSED, {})
    assert result.changed is False
    assert print_ir(result.graph) == dedent(TRANSPOSED).lstrip("\n")


def test_scalar_results_become_constant_nodes_keeping_their_names():
    text = """
        graph main {
          input %x: f32[3]
          %a: f32[] = constant() {value=2.0, dtype=f32}
          %b: f32[] = constant() {value=3.0, dtype=f32}
          %n: i64[] = constant() {value=7, dtype=i64}
          %nf: f32[] = cast(%n) {dtype=f32}
          %ab: f32[] = mul(%a, %b)
          %s: f32[] = add(%ab, %nf)
          %y: f32[3] = mul(%x, %s)
          return %y
        }
    """
    result = fold(text, {})
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[3]
          %a: f32[] = constant() {value=2.0, dtype=f32}
          %b: f32[] = constant() {value=3.0, dtype=f32}
          %n: i64[] = constant() {value=7, dtype=i64}
          %s: f32[] = constant() {value=13.0, dtype=f32}
          %y: f32[3] = mul(%x, %s)
          return %y
        }
        """)
    assert_same_values(text, {}, [torch.randn(3)])


GROWTH = """
    graph main {
      input %x: f32[64, 64]
      weight @b: f32[1, 64]
      %e: f32[64, 64] = expand(@b) {shape=[64, 64]}
      %f: f32[64, 64] = full() {shape=[64, 64], value=1.0, dtype=f32}
      %ef: f32[64, 64] = add(%e, %f)
      %y: f32[64, 64] = add(%x, %ef)
      return %y
    }
"""


def test_growth_rule_keeps_large_expansions_as_nodes():
    weights = {"b": torch.randn(1, 64)}
    result = fold(GROWTH, weights)
    assert result.changed is False
    assert print_ir(result.graph) == dedent(GROWTH).lstrip("\n")


def test_growth_option_allows_larger_results():
    weights = {"b": torch.randn(1, 64)}
    result = assert_same_values(GROWTH, weights, [torch.randn(64, 64)],
                                "fold_constants{max_growth=64.0}")
    assert result.changed is True
    # the 16 KiB full comes from no weights, so it is never computed at compile time
    assert [n.op for n in result.graph.nodes] == ["full", "add", "add"]
    assert result.graph.nodes[1].inputs[0].name == "folded.e"


def test_small_results_fold_even_from_creation_ops():
    text = """
        graph main {
          input %x: f32[8]
          %i: i64[8] = arange() {start=0, end=8, step=1, dtype=i64}
          %f: f32[8] = cast(%i) {dtype=f32}
          %s: f32[8] = sin(%f)
          %big: i64[1024] = arange() {start=0, end=1024, step=1, dtype=i64}
          %bigf: f32[1024] = cast(%big) {dtype=f32}
          %y: f32[8] = add(%x, %s)
          return %y, %bigf
        }
    """
    result = assert_same_values(text, {}, [torch.randn(8)])
    out = print_ir(result.graph)
    assert "weight @folded.s: f32[8]" in out
    assert "%y: f32[8] = add(%x, @folded.s)" in out
    # 4 KiB from 0 stored bytes exceeds always_fold_bytes=1024: stays computed at run time
    assert "%bigf: f32[1024] = cast(%big) {dtype=f32}" in out
    nothing_small = fold(text, {}, "fold_constants{always_fold_bytes=0}")
    assert nothing_small.changed is False


def test_symbolic_attributes_are_not_folded():
    text = """
        graph main {
          symbol s0 in [1, 32]
          input %x: f32[s0]
          %i: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
          %f: f32[s0] = cast(%i) {dtype=f32}
          %y: f32[s0] = add(%x, %f)
          return %y
        }
    """
    assert fold(text, {}).changed is False


def test_multi_output_and_returned_results_become_weights():
    text = """
        graph main {
          input %x: f32[4]
          weight @w: f32[4, 8]
          %v: f32[4, 2], %i: i64[4, 2] = topk(@w) {k=2, dim=-1, largest=true, sorted=true}
          %m: f32[4] = amax(%v) {dims=[1], keepdim=false}
          %y: f32[4] = add(%x, %m)
          return %y, %i
        }
    """
    weights = {"w": torch.randn(4, 8)}
    result = assert_same_values(text, weights, [torch.randn(4)])
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[4]
          weight @w: f32[4, 8]
          weight @folded.i: i64[4, 2]
          weight @folded.m: f32[4]
          %y: f32[4] = add(%x, @folded.m)
          return %y, @folded.i
        }
        """)


def test_reference_results_take_the_declared_type():
    from compiler.ir import DType, Node, TensorType, Value
    from passes.fold_constants import _as_declared

    value = Value("s", TensorType(DType.i32, (2,)))
    node = Node("sum", [], {}, [value])
    got = _as_declared(node, value, torch.tensor([6, 9], dtype=torch.int64))
    assert got.dtype == torch.int32 and got.tolist() == [6, 9]
    with pytest.raises(RuntimeError, match="shape rule disagrees"):
        _as_declared(node, value, torch.zeros(3, dtype=torch.int32))


def test_new_weight_names_avoid_existing_ones():
    text = """
        graph main {
          input %x: f32[3]
          weight @w: f32[3]
          weight @folded.a: f32[3]
          %a: f32[3] = neg(@w)
          %y: f32[3] = add(%x, %a)
          %z: f32[3] = add(%y, @folded.a)
          return %z
        }
    """
    weights = {"w": torch.randn(3), "folded.a": torch.randn(3)}
    result = assert_same_values(text, weights, [torch.randn(3)])
    assert "%y: f32[3] = add(%x, @folded.a_1)" in print_ir(result.graph)


def test_numpy_weight_data_is_accepted():
    import numpy as np

    weights = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    result = fold(TRANSPOSED, weights)
    assert torch.equal(result.graph.weight_data["folded.ws"],
                       torch.from_numpy(weights["w"]).t() * 2)


def test_negative_options_are_refused():
    with pytest.raises(DayzeroError, match="max_growth"):
        parse_pipeline("fold_constants{max_growth=-1.0}")


def test_rotary_style_table_end_to_end():
    text = """
        graph main {
          input %x: f32[2, 8, 4]
          weight @inv_freq: f32[4]
          %pos: i64[8] = arange() {start=0, end=8, step=1, dtype=i64}
          %posf: f32[8] = cast(%pos) {dtype=f32}
          %p2: f32[8, 1] = reshape(%posf) {shape=[8, 1]}
          %ang: f32[8, 4] = mul(%p2, @inv_freq)
          %cos: f32[8, 4] = cos(%ang)
          %y: f32[2, 8, 4] = mul(%x, %cos)
          return %y
        }
    """
    weights = {"inv_freq": 1.0 / (10000 ** (torch.arange(4, dtype=torch.float32) / 4))}
    result = assert_same_values(text, weights, [torch.randn(2, 8, 4)])
    assert [n.op for n in result.graph.nodes] == ["arange", "mul"]
