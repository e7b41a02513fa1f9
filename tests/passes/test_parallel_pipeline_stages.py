"""Pipeline stages: the cost model, balanced cuts, and send/recv wiring on a small chain."""

from __future__ import annotations

import pytest
import torch

from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.ir import DType, Graph, TensorType, parse_ir, print_ir
from passes.parallel import Mesh
from passes.parallel.cost import MEMORY_RATIO, node_cost, planning_sizes
from passes.parallel.partition import partition
from passes.parallel.pipeline_stages import plan_stages, recomputable, stage_report
from tests.passes.parallel_util import run_rank_graphs


def _chain(n: int, width: int = 32) -> Graph:
    """x -> linear -> linear -> ... (n equal linears) -> y, weights seeded."""
    g = Graph("chain")
    x = g.add_input("x", TensorType(DType.f32, (4, width)))
    gen = torch.Generator().manual_seed(0)
    for i in range(n):
        w = g.add_weight(f"w{i}", TensorType(DType.f32, (width, width)),
                         torch.randn(width, width, generator=gen) / width ** 0.5)
        x = g.add_node("linear", [x, w, None], names=[f"h{i}"]).output
    g.outputs = [x]
    return g


def test_cost_of_a_linear_is_its_flops_and_bytes():
    g = parse_ir("""graph g {
  symbol s0 in [1, 128]
  input %x: f32[s0, 64]
  weight @w: f32[32, 64]
  %y: f32[s0, 32] = linear(%x, @w, _)
  %z: f32[s0, 32] = reshape(%y) {shape=[s0, 32]}
  return %z
}
""")
    sizes = planning_sizes(g)
    assert sizes == {"s0": 128}
    cost = node_cost(g, g.nodes[0], sizes)
    assert cost.flops == 2 * 128 * 32 * 64
    assert cost.bytes == 4 * (128 * 64 + 32 * 64 + 128 * 32)
    assert cost.weight_bytes == 4 * 32 * 64
    assert cost.cost == max(cost.flops, cost.bytes * MEMORY_RATIO)
    assert node_cost(g, g.nodes[1], sizes).cost == 0  # views move nothing


@pytest.mark.parametrize("pp,bounds", [(1, [(0, 6)]), (2, [(0, 3), (3, 6)]),
                                       (3, [(0, 2), (2, 4), (4, 6)])])
def test_equal_nodes_split_into_equal_stages(pp, bounds):
    stages = plan_stages(_chain(6), pp)
    assert [(s.start, s.end) for s in stages] == bounds
    assert [s.recv_bytes for s in stages] == [0] + [4 * 32 * 4] * (pp - 1)
    report = stage_report(stages)
    costs = [s.cost for s in stages]  # later stages also pay for what they receive
    assert report["imbalance"] == pytest.approx(max(costs) * pp / sum(costs) - 1, abs=1e-4)
    assert [s["stage"] for s in report["stages"]] == list(range(pp))


def test_a_heavy_node_gets_a_stage_of_its_own():
    g = _chain(4, width=16)
    big = g.add_weight("big", TensorType(DType.f32, (16, 16)), torch.eye(16))
    for _ in range(12):  # twelve cheap nodes after one expensive one keep it company
        g.outputs = [g.add_node("relu", [g.outputs[0]]).output]
    g.outputs = [g.add_node("linear", [g.outputs[0], big, None]).output]
    stages = plan_stages(g, 2)
    costs = [s.cost for s in stages]
    assert max(costs) <= 0.6 * sum(costs)


def test_more_stages_than_nodes_is_an_error_naming_the_key():
    with pytest.raises(DayzeroError, match=r"'parallel.pipeline_parallel' = 5 is more stages "
                                           r"than the graph has nodes \(3\)"):
        plan_stages(_chain(3), 5)


def test_chain_ranks_send_and_receive_and_match_one_device():
    g = _chain(4)
    x = torch.randn(4, 32)
    want = run_graph(g, g.weight_data, [x])[0]
    plan = partition(g, Mesh(pp=2))
    first, second = (print_ir(r.graph) for r in plan.ranks)
    assert "send(%h1) {peer=1, tag=0}" in first and "recv" not in first
    assert "recv() {shape=[4, 32], dtype=f32, peer=0, tag=0}" in second
    assert "@w0" in first and "@w0" not in second  # each stage holds only its weights
    outputs = run_rank_graphs([r.graph for r in plan.ranks], [x])
    assert outputs[0] == []
    torch.testing.assert_close(outputs[1][0], want, rtol=1e-6, atol=1e-6)


def test_input_only_nodes_are_recomputed_not_sent():
    g = parse_ir("""graph g {
  symbol s0 in [2, 64]
  input %x: f32[s0, 512]
  weight @w: f32[512, 512]
  weight @v: f32[512, 512]
  %pos: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
  %posf: f32[s0] = cast(%pos) {dtype=f32}
  %col: f32[s0, 1] = reshape(%posf) {shape=[s0, 1]}
  %h: f32[s0, 512] = linear(%x, @w, _)
  %h2: f32[s0, 512] = add(%h, %col)
  %y: f32[s0, 512] = linear(%h2, @v, _)
  %y2: f32[s0, 512] = add(%y, %col)
  return %y2
}
""")
    gen = torch.Generator().manual_seed(1)
    g.weight_data.update({"w": torch.randn(512, 512, generator=gen) / 16,
                          "v": torch.randn(512, 512, generator=gen) / 16})
    assert recomputable(g) == {0, 1, 2}
    x = torch.randn(5, 512)
    want = run_graph(g, g.weight_data, [x])[0]
    plan = partition(g, Mesh(pp=2))
    second = print_ir(plan.ranks[1].graph)
    assert "arange" in second and second.count("recv(") == 1  # only the activation travels
    got = run_rank_graphs([r.graph for r in plan.ranks], [x])[1][0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
