from __future__ import annotations

from textwrap import dedent

import torch

from compiler.ir import print_ir

DEAD = """
    graph main {
      input %x: f32[2, 3]
      input %unused_input: f32[3]
      weight @w: f32[3, 3]
      weight @dead_w: f32[3]
      %a: f32[2, 3] = relu(%x)
      %dead1: f32[2, 3] = add(%a, @dead_w)
      %dead2: f32[2, 3] = exp(%dead1)
      %b: f32[2, 3] = matmul(%a, @w)
      return %b
    }
"""


def test_removes_dead_nodes_and_weights(run_pass):
    weights = {"w": torch.ones(3, 3), "dead_w": torch.ones(3)}
    result = run_pass(DEAD, "eliminate_dead_code", weights)
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[2, 3]
          input %unused_input: f32[3]
          weight @w: f32[3, 3]
          %a: f32[2, 3] = relu(%x)
          %b: f32[2, 3] = matmul(%a, @w)
          return %b
        }
        """)
    assert set(result.graph.weight_data) == {"w"}


def test_second_run_reports_unchanged(run_pass):
    first = run_pass(DEAD, "eliminate_dead_code")
    second = run_pass(print_ir(first.graph), "eliminate_dead_code")
    assert second.changed is False
    assert print_ir(second.graph) == print_ir(first.graph)


def test_only_unused_weight_is_a_change(run_pass):
    text = """
        graph main {
          input %x: f32[3]
          weight @w: f32[3]
          %a: f32[3] = neg(%x)
          return %a
        }
    """
    result = run_pass(text, "eliminate_dead_code")
    assert result.changed is True
    assert "@w" not in print_ir(result.graph)


def test_keeps_multi_output_node_with_one_used_output(run_pass):
    text = """
        graph main {
          input %x: f32[4, 8]
          %v: f32[4, 2], %i: i64[4, 2] = topk(%x) {k=2, dim=-1, largest=true, sorted=true}
          return %i
        }
    """
    result = run_pass(text, "eliminate_dead_code")
    assert result.changed is False
    assert "topk" in print_ir(result.graph)


def test_returned_weight_is_kept(run_pass):
    text = """
        graph main {
          input %x: f32[3]
          weight @w: f32[3]
          %dead: f32[3] = neg(%x)
          return @w, %x
        }
    """
    result = run_pass(text, "eliminate_dead_code")
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          input %x: f32[3]
          weight @w: f32[3]
          return @w, %x
        }
        """)
