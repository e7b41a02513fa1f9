"""fuse_groups: which ops form one kernel, the no-cycle rule, the cost rule, order, round trip."""

from __future__ import annotations

from textwrap import dedent

import torch

from backends.reference.interpreter import run_graph
from compiler.ir import parse_ir, print_ir
from passes import parse_pipeline
from passes.fusion.groups import collect_groups
from tests.passes.fusion_util import fuse_text, random_data

SOFTMAX = """
    graph main {
      symbol s0 in [1, 512]
      input %x: f32[s0, 64]
      %m: f32[s0, 1] = amax(%x) {dims=[-1], keepdim=true}
      %d: f32[s0, 64] = sub(%x, %m)
      %e: f32[s0, 64] = exp(%d)
      %s: f32[s0, 1] = sum(%e) {dims=[-1], keepdim=true}
      %p: f32[s0, 64] = div(%e, %s)
      return %p
    }
"""


def groups_of(graph) -> list[list[str]]:
    return [[n.outputs[0].name for n in g.nodes] for g in collect_groups(graph)]


def assert_values_unchanged(text: str, graph) -> None:
    before = parse_ir(dedent(text))
    inputs, weights = random_data(before)
    for got, want in zip(run_graph(graph, weights, inputs), run_graph(before, weights, inputs)):
        assert torch.equal(got, want)


def test_softmax_written_out_is_one_kernel_with_two_reductions():
    graph, _ = fuse_text(SOFTMAX, "fuse_groups")
    assert print_ir(graph) == dedent("""\
        graph main {
          symbol s0 in [1, 512]
          input %x: f32[s0, 64]
          %m: f32[s0, 1] = amax(%x) {dims=[-1], keepdim=true, fusion_group=0}
          %d: f32[s0, 64] = sub(%x, %m) {fusion_group=0}
          %e: f32[s0, 64] = exp(%d) {fusion_group=0}
          %s: f32[s0, 1] = sum(%e) {dims=[-1], keepdim=true, fusion_group=0}
          %p: f32[s0, 64] = div(%e, %s) {rounding_mode=none, fusion_group=0}
          return %p
        }
        """)
    (group,) = collect_groups(graph)
    assert [v.name for v in group.inputs] == ["x"] and [v.name for v in group.outputs] == ["p"]
    assert_values_unchanged(SOFTMAX, graph)


def test_groups_stop_at_ops_a_kernel_generator_does_not_emit():
    text = """
        graph main {
          input %x: f32[8, 16]
          weight @w: f32[16, 16]
          %a: f32[8, 16] = tanh(%x)
          %b: f32[8, 16] = mul(%a, %a)
          %mm: f32[8, 16] = matmul(%b, @w)
          %c: f32[8, 16] = relu(%mm)
          %d: f32[8, 16] = add(%c, %x)
          return %d
        }
    """
    graph, _ = fuse_text(text, "fuse_groups")
    assert groups_of(graph) == [["a", "b"], ["c", "d"]]
    assert_values_unchanged(text, graph)


def test_a_merge_that_would_make_a_cycle_is_refused():
    # %e4 reads %e2 (group {e1, e2}) and %e3, which depends on that group through a matmul:
    # putting e4 with e1 and e2 would make the group both before and after the matmul.
    text = """
        graph main {
          input %x: f32[8, 8]
          %e1: f32[8, 8] = exp(%x)
          %e2: f32[8, 8] = tanh(%e1)
          %mm: f32[8, 8] = matmul(%e1, %x)
          %e3: f32[8, 8] = neg(%mm)
          %e4: f32[8, 8] = mul(%e2, %e3)
          return %e4
        }
    """
    graph, _ = fuse_text(text, "fuse_groups")
    assert groups_of(graph) == [["e1", "e2"], ["e3", "e4"]]
    assert [n.outputs[0].name for n in graph.nodes] == ["e1", "e2", "mm", "e3", "e4"]


def test_cost_rule_refuses_recomputing_a_broadcast_producer():
    # exp(w) has 64 elements; fused into the [4096, 64] kernel it would be computed 4096 times
    text = """
        graph main {
          input %x: f32[4096, 64]
          input %w: f32[64]
          %p: f32[64] = exp(%w)
          %y: f32[4096, 64] = mul(%x, %p)
          %z: f32[4096, 64] = tanh(%y)
          return %z
        }
    """
    graph, _ = fuse_text(text, "fuse_groups")
    assert groups_of(graph) == [["y", "z"]]
    same_size = text.replace("f32[64]", "f32[4096, 64]")
    graph, _ = fuse_text(same_size, "fuse_groups")
    assert groups_of(graph) == [["p", "y", "z"]]


def test_row_level_ops_between_reductions_are_not_recomputation():
    text = """
        graph main {
          input %x: f32[128, 64]
          weight @w: f32[64]
          %sq: f32[128, 64] = mul(%x, %x)
          %ms: f32[128, 1] = mean(%sq) {dims=[-1], keepdim=true}
          %eps: f32[] = constant() {value=1e-06, dtype=f32}
          %a: f32[128, 1] = add(%ms, %eps)
          %r: f32[128, 1] = rsqrt(%a)
          %n: f32[128, 64] = mul(%x, %r)
          %o: f32[128, 64] = mul(%n, @w)
          return %o
        }
    """
    graph, _ = fuse_text(text, "fuse_groups")
    assert groups_of(graph) == [["sq", "ms", "a", "r", "n", "o"]]
    assert_values_unchanged(text, graph)


def test_reductions_over_different_axes_stay_in_different_kernels():
    text = """
        graph main {
          input %x: f32[4, 8]
          %e: f32[4, 8] = exp(%x)
          %rows: f32[4, 1] = sum(%e) {dims=[1], keepdim=true}
          %cols: f32[1, 8] = sum(%e) {dims=[0], keepdim=true}
          %r: f32[4, 1] = neg(%rows)
          %c: f32[1, 8] = neg(%cols)
          return %r, %c
        }
    """
    graph, _ = fuse_text(text, "fuse_groups")
    for names in groups_of(graph):
        assert not {"rows", "cols"} <= set(names)
    assert ["e", "rows", "r"] in groups_of(graph)


def test_max_nodes_bounds_a_group_and_rerunning_changes_nothing():
    lines = ["graph main {", "  input %x: f32[4, 4]"]
    prev = "%x"
    for i in range(10):
        lines.append(f"  %t{i}: f32[4, 4] = tanh({prev})")
        prev = f"%t{i}"
    text = "\n".join(lines + [f"  return {prev}", "}"]) + "\n"
    graph, _ = fuse_text(text, "fuse_groups{max_nodes=4}")
    assert [len(g.nodes) for g in collect_groups(graph)] == [4, 4, 2]
    again = parse_pipeline("fuse_groups{max_nodes=4}")[0].run(graph)
    assert again.changed is False
    regrouped = parse_pipeline("fuse_groups")[0].run(graph)
    assert regrouped.changed is True and [len(g.nodes) for g in collect_groups(graph)] == [10]


def test_groups_are_contiguous_and_round_trip(roundtrip):
    text = """
        graph main {
          input %x: f32[8, 16]
          input %y: f32[8, 16]
          %a: f32[8, 16] = exp(%x)
          %b: f32[8, 16] = exp(%y)
          %c: f32[8, 16] = tanh(%a)
          %d: f32[8, 16] = tanh(%b)
          return %c, %d
        }
    """
    graph, _ = fuse_text(text, "fuse_groups")
    assert [n.outputs[0].name for n in graph.nodes] == ["a", "c", "b", "d"]
    assert [n.attrs["fusion_group"] for n in graph.nodes] == [0, 0, 1, 1]
    roundtrip(graph)
    assert_values_unchanged(text, graph)
