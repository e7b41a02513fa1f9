"""schedule_for_memory and plan_memory as passes: order, peak, unchanged results, options."""

from __future__ import annotations

import pytest
import torch

from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.ir import print_ir
from passes import format_pipeline, parse_pipeline
from passes.memory import MemoryPlan, memory_schedule, plan_graph, verify_plan
from passes.plan_memory import memory_plan_for
from tests.passes.memory_util import graph, planned

# Two branches that each blow x up 8x and reduce it back. Run as written, both big
# intermediates are live together; finishing one branch first needs only one at a time.
BRANCHY = """
    graph main {
      input %x: f32[32, 16]
      weight @up1: f32[128, 16]
      weight @up2: f32[128, 16]
      weight @down: f32[16, 128]
      %a1: f32[32, 128] = linear(%x, @up1, _)
      %b1: f32[32, 128] = linear(%x, @up2, _)
      %a2: f32[32, 128] = gelu(%a1) {approximate="none"}
      %b2: f32[32, 128] = relu(%b1)
      %a3: f32[32, 16] = linear(%a2, @down, _)
      %b3: f32[32, 16] = linear(%b2, @down, _)
      %y: f32[32, 16] = add(%a3, %b3)
      return %y
    }
"""

SCHEDULED = """\
graph main {
  input %x: f32[32, 16]
  weight @up1: f32[128, 16]
  weight @up2: f32[128, 16]
  weight @down: f32[16, 128]
  %a1: f32[32, 128] = linear(%x, @up1, _)
  %a2: f32[32, 128] = gelu(%a1) {approximate="none"}
  %a3: f32[32, 16] = linear(%a2, @down, _)
  %b1: f32[32, 128] = linear(%x, @up2, _)
  %b2: f32[32, 128] = relu(%b1)
  %b3: f32[32, 16] = linear(%b2, @down, _)
  %y: f32[32, 16] = add(%a3, %b3)
  return %y
}
"""


def weights(g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(*v.type.shape, generator=gen) for name, v in g.weights.items()}


def test_scheduling_finishes_a_branch_before_starting_the_next(run_pass):
    before = graph(BRANCHY)
    data = weights(before)
    x = torch.randn(32, 16)
    expected = run_graph(before, data, [x])
    old = planned(before)

    result = run_pass(BRANCHY, "schedule_for_memory")
    assert result.changed is True
    assert print_ir(result.graph) == SCHEDULED
    new = planned(result.graph)
    # 16 KiB per big intermediate (in place through the activation), 2 KiB per small one
    assert (old.lower_bound, new.lower_bound) == (2 * 16384 + 2048, 16384 + 2 * 2048)
    assert new.arena_bytes == new.lower_bound < old.arena_bytes
    (got,) = run_graph(result.graph, data, [x])
    assert torch.equal(got, expected[0])


def test_scheduling_keeps_an_order_it_cannot_improve(run_pass):
    result = run_pass(SCHEDULED, "schedule_for_memory")
    assert result.changed is False and print_ir(result.graph) == SCHEDULED


def test_scheduling_runs_operand_free_nodes_just_before_their_reader(run_pass):
    text = """
        graph main {
          input %x: f32[64, 64]
          %c: f32[64, 64] = full() {shape=[64, 64], value=2.0, dtype=f32}
          %a: f32[64, 64] = exp(%x)
          %b: f32[] = sum(%a) {dims=[0, 1], keepdim=false}
          %y: f32[64, 64] = mul(%c, %b)
          return %y
        }
    """
    result = run_pass(text, "schedule_for_memory")
    assert result.changed is True
    assert [n.outputs[0].name for n in result.graph.nodes] == ["a", "b", "c", "y"]
    g = graph(text)
    assert planned(result.graph).lower_bound < planned(g).lower_bound
    x = torch.randn(64, 64)
    assert torch.equal(run_graph(result.graph, {}, [x])[0], run_graph(g, {}, [x])[0])


def test_a_schedule_is_a_permutation_in_topological_order():
    g = graph(BRANCHY)
    order = memory_schedule(g)
    assert sorted(map(id, order)) == sorted(map(id, g.nodes))
    seen = {id(v) for v in (*g.inputs, *g.weights.values())}
    for node in order:
        assert all(v is None or id(v) in seen for v in node.inputs)
        seen.update(id(v) for v in node.outputs)


def test_scheduling_uses_the_given_sizes(run_pass):
    text = BRANCHY.replace("f32[32,", "f32[s0,").replace("graph main {", "graph main {\n"
                                                          "  symbol s0 in [1, 32]")
    result = run_pass(text, "schedule_for_memory{sizes=s0:4}")
    assert result.changed is True
    verify_plan(plan_graph(result.graph, sizes={"s0": 4}), result.graph)


# -- plan_memory --------------------------------------------------------------------------------

def test_plan_memory_checks_the_plan_and_leaves_the_graph_alone(run_pass):
    result = run_pass(BRANCHY, "plan_memory")
    assert result.changed is False
    assert print_ir(result.graph) == print_ir(graph(BRANCHY))


def test_the_recorded_plan_is_the_last_plan_memory_of_the_pipeline():
    g = graph(BRANCHY.replace("f32[32,", "f32[s0,").replace("graph main {", "graph main {\n"
                                                            "  symbol s0 in [1, 32]"))
    assert memory_plan_for(parse_pipeline("remove_noops"), g) is None
    pipeline = parse_pipeline("plan_memory,plan_memory{sizes=s0:4,alignment=16}")
    plan = MemoryPlan.from_json(memory_plan_for(pipeline, g))
    assert plan.sizes == {"s0": 4} and plan.alignment == 16
    verify_plan(plan, g)
    assert plan == plan_graph(g, sizes={"s0": 4}, alignment=16)  # deterministic


def test_memory_pipelines_print_back_the_same():
    text = "schedule_for_memory{sizes=s0:128;s1:4},plan_memory{inplace=false,algorithm=search}"
    assert format_pipeline(parse_pipeline(text)) == text


@pytest.mark.parametrize("spec,message", [
    ("plan_memory{alignment=48}", "not a power of two"),
    ("plan_memory{algorithm=magic}", "no algorithm 'magic'"),
    ("plan_memory{sizes=s0}", "not SYMBOL:VALUE"),
    ("schedule_for_memory{sizes=s7:3}", "unknown symbol"),
])
def test_bad_options_are_clear_errors(run_pass, spec, message):
    with pytest.raises(DayzeroError, match=message):
        run_pass(BRANCHY, spec)


def test_a_single_algorithm_can_be_chosen(run_pass):
    g = graph(BRANCHY)
    (pass_,) = parse_pipeline("plan_memory{algorithm=greedy_by_breadth}")
    plan = pass_.plan(g)
    assert list(plan.candidates) == ["greedy_by_breadth"]
    verify_plan(plan, g)
    assert print_ir(g) == print_ir(run_pass(BRANCHY, "plan_memory").graph)
