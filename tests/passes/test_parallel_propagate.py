"""Sharding seeds, propagation and localization: IR text in, IR text out, numerics on threads."""

from __future__ import annotations

import textwrap

import pytest
import torch

from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.ir import parse_ir, print_ir
from passes.parallel import Mesh
from passes.parallel.localize import localize
from tests.passes.parallel_util import run_rank_graphs

MLP = """\
graph mlp {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  weight @up: f32[16, 8]
  weight @up_b: f32[16]
  weight @down: f32[8, 16]
  weight @down_b: f32[8]
  %h: f32[s0, 16] = linear(%x, @up, @up_b)
  %a: f32[s0, 16] = relu(%h)
  %y: f32[s0, 8] = linear(%a, @down, @down_b)
  %z: f32[s0, 8] = add(%y, %x)
  return %z
}
"""

SEEDED = """\
graph mlp {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  weight @up: f32[16, 8]
  weight @up_b: f32[16]
  weight @down: f32[8, 16]
  weight @down_b: f32[8]
  %up.tp: f32[16, 8] = shard(@up) {layout="tp:S0"}
  %up_b.tp: f32[16] = shard(@up_b) {layout="tp:S0"}
  %h: f32[s0, 16] = linear(%x, %up.tp, %up_b.tp)
  %a: f32[s0, 16] = relu(%h)
  %down.tp: f32[8, 16] = shard(@down) {layout="tp:S1"}
  %y: f32[s0, 8] = linear(%a, %down.tp, _)
  %y.bias: f32[s0, 8] = add(%y, @down_b)
  %z: f32[s0, 8] = add(%y.bias, %x)
  return %z
}
"""

PROPAGATED = """\
graph mlp {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  weight @up: f32[16, 8]
  weight @up_b: f32[16]
  weight @down: f32[8, 16]
  weight @down_b: f32[8]
  %up.tp: f32[16, 8] = shard(@up) {layout="tp:S0"}
  %up_b.tp: f32[16] = shard(@up_b) {layout="tp:S0"}
  %h: f32[s0, 16] = linear(%x, %up.tp, %up_b.tp)
  %h.shard: f32[s0, 16] = shard(%h) {layout="tp:S1"}
  %a: f32[s0, 16] = relu(%h.shard)
  %a.shard: f32[s0, 16] = shard(%a) {layout="tp:S1"}
  %down.tp: f32[8, 16] = shard(@down) {layout="tp:S1"}
  %y: f32[s0, 8] = linear(%a.shard, %down.tp, _)
  %y.shard: f32[s0, 8] = shard(%y) {layout="tp:P"}
  %y.ar: f32[s0, 8] = all_reduce(%y.shard) {axis="tp", ranks=none}
  %y.bias: f32[s0, 8] = add(%y.ar, @down_b)
  %z: f32[s0, 8] = add(%y.bias, %x)
  return %z
}
"""

RANK1 = """\
graph mlp {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  weight @up: f32[8, 8]
  weight @up_b: f32[8]
  weight @down: f32[8, 8]
  weight @down_b: f32[8]
  %h: f32[s0, 8] = linear(%x, @up, @up_b)
  %a: f32[s0, 8] = relu(%h)
  %y: f32[s0, 8] = linear(%a, @down, _)
  %y.ar: f32[s0, 8] = all_reduce(%y) {axis="tp", ranks=[0, 1]}
  %y.bias: f32[s0, 8] = add(%y.ar, @down_b)
  %z: f32[s0, 8] = add(%y.bias, %x)
  return %z
}
"""


def _weights(graph, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(*[int(d) for d in v.type.shape], generator=gen)
            for name, v in graph.weights.items()}


def test_tensor_parallel_places_column_then_row_seeds(run_pass):
    result = run_pass(MLP, "shard_tensor_parallel{size=2}")
    assert result.changed
    assert print_ir(result.graph) == SEEDED


def test_propagation_inserts_one_all_reduce_and_annotates(run_pass, roundtrip):
    result = run_pass(SEEDED, "propagate_sharding{tp=2}")
    assert result.changed
    assert print_ir(result.graph) == PROPAGATED
    roundtrip(PROPAGATED)


def test_propagation_is_idempotent(run_pass):
    again = run_pass(PROPAGATED, "propagate_sharding{tp=2}")
    assert not again.changed
    assert print_ir(again.graph) == PROPAGATED
    assert not run_pass(SEEDED, "shard_tensor_parallel{size=2}").changed


def test_annotated_graph_still_computes_the_same_on_one_device():
    plain, annotated = parse_ir(MLP), parse_ir(PROPAGATED)
    weights = _weights(plain)
    x = torch.randn(5, 8)
    torch.testing.assert_close(run_graph(annotated, weights, [x])[0],
                               run_graph(plain, weights, [x])[0], rtol=0, atol=0)


def test_localized_ranks_hold_shards_and_match_one_device():
    graph = parse_ir(PROPAGATED)
    graph.weight_data.update(_weights(graph))
    ranks = [localize(graph, Mesh(tp=2), r).graph for r in range(2)]
    assert print_ir(ranks[1]) == RANK1
    torch.testing.assert_close(ranks[1].weight_data["up"], graph.weight_data["up"][8:])
    torch.testing.assert_close(ranks[0].weight_data["down"], graph.weight_data["down"][:, :8])
    x = torch.randn(6, 8)
    want = run_graph(parse_ir(MLP), graph.weight_data, [x])[0]
    for (got,) in run_rank_graphs(ranks, [x]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


SEED_ON_ACTIVATIONS = """\
graph g {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  weight @w: f32[8, 8]
  %xs: f32[s0, 8] = shard(%x) {layout="tp:S1"}
  %y: f32[s0, 8] = linear(%xs, @w, _)
  %ys: f32[s0, 8] = shard(%y) {layout="tp:S1"}
  %z: f32[s0, 8] = tanh(%ys)
  return %z
}
"""


def test_reduce_scatter_and_local_slices_from_activation_seeds(run_pass):
    graph = run_pass(SEED_ON_ACTIVATIONS, "propagate_sharding{tp=2}").graph
    text = print_ir(graph)
    assert "reduce_scatter(%y.shard) {axis=\"tp\", dim=1, ranks=none}" in text
    assert "all_gather(%z.local.shard) {axis=\"tp\", dim=1, ranks=none}" in text
    graph.weight_data.update(_weights(graph, 3))
    ranks = [localize(graph, Mesh(tp=2), r).graph for r in range(2)]
    local = print_ir(ranks[1])
    assert "slice(%x) {dim=1, start=4, end=8, step=1}" in local  # the replicated input, split
    assert "weight @w: f32[8, 4]" in local  # read only split: stored split
    x = torch.randn(3, 8)
    want = run_graph(parse_ir(SEED_ON_ACTIVATIONS), graph.weight_data, [x])[0]
    for (got,) in run_rank_graphs(ranks, [x]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


BATCHED = """\
graph g {
  input %x: f32[4, 8]
  weight @w: f32[6, 8]
  %y: f32[4, 6] = linear(%x, @w, _)
  %s: f32[4] = sum(%y) {dims=[1], keepdim=false}
  return %y, %s
}
"""


BATCHED_DP = """\
graph g {
  input %x: f32[4, 8]
  weight @w: f32[6, 8]
  %x.dp: f32[4, 8] = shard(%x) {layout="dp:S0"}
  %y.local: f32[4, 6] = linear(%x.dp, @w, _)
  %y.local.shard: f32[4, 6] = shard(%y.local) {layout="dp:S0"}
  %s.local: f32[4] = sum(%y.local.shard) {dims=[1], keepdim=false}
  %s.local.shard: f32[4] = shard(%s.local) {layout="dp:S0"}
  %y: f32[4, 6] = all_gather(%y.local.shard) {axis="dp", dim=0, ranks=none}
  %s: f32[4] = all_gather(%s.local.shard) {axis="dp", dim=0, ranks=none}
  return %y, %s
}
"""

BATCHED_RANK1 = """\
graph g {
  input %x: f32[4, 8]
  weight @w: f32[6, 8]
  %x.dp.dp1: f32[2, 8] = slice(%x) {dim=0, start=2, end=4, step=1}
  %y.local: f32[2, 6] = linear(%x.dp.dp1, @w, _)
  %s.local: f32[2] = sum(%y.local) {dims=[1], keepdim=false}
  %y: f32[4, 6] = all_gather(%y.local) {axis="dp", dim=0, ranks=[0, 1]}
  %s: f32[4] = all_gather(%s.local) {axis="dp", dim=0, ranks=[0, 1]}
  return %y, %s
}
"""


def test_data_parallel_splits_the_batch_and_gathers_outputs(run_pass):
    seeded = run_pass(BATCHED, "shard_data_parallel{size=2}")
    graph = run_pass(print_ir(seeded.graph), "propagate_sharding{dp=2}").graph
    assert print_ir(graph) == BATCHED_DP  # the outputs keep their names, made whole
    graph.weight_data.update(_weights(graph))
    ranks = [localize(graph, Mesh(dp=2), r).graph for r in range(2)]
    assert print_ir(ranks[1]) == BATCHED_RANK1
    x = torch.randn(4, 8)
    want = run_graph(parse_ir(BATCHED), graph.weight_data, [x])
    for got in run_rank_graphs(ranks, [x]):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_data_parallel_refuses_a_batch_it_cannot_split(run_pass):
    with pytest.raises(DayzeroError, match=r"'parallel.data_parallel' = 3 does not divide the "
                                           r"batch size 4"):
        run_pass(BATCHED, "shard_data_parallel{size=3}")
    dynamic = BATCHED.replace("graph g {", "graph g {\n  symbol b in [1, 8]").replace(
        "f32[4, 8]", "f32[b, 8]").replace("f32[4, 6]", "f32[b, 6]").replace("f32[4]", "f32[b]")
    with pytest.raises(DayzeroError, match="needs a static batch size"):
        run_pass(dynamic, "shard_data_parallel{size=2}")


def test_a_seed_on_an_axis_the_mesh_lacks_is_an_error(run_pass):
    with pytest.raises(DayzeroError, match=r"mesh axis \['tp'\]"):
        run_pass(SEED_ON_ACTIVATIONS, "propagate_sharding{dp=2}")


def test_a_collective_on_the_wrong_layout_is_an_error(run_pass):
    text = textwrap.dedent("""\
        graph g {
          input %x: f32[4, 8]
          %y: f32[4, 8] = all_reduce(%x) {axis="tp", ranks=none}
          return %y
        }
        """)
    with pytest.raises(DayzeroError, match="all_reduce over 'tp' gets a value of layout R"):
        run_pass(text, "propagate_sharding{tp=2}")


CONV1D_MLP = """\
graph g {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  weight @fc: f32[8, 16]
  weight @proj: f32[16, 8]
  %h: f32[s0, 16] = matmul(%x, @fc)
  %a: f32[s0, 16] = gelu(%h) {approximate="tanh"}
  %y: f32[s0, 8] = matmul(%a, @proj)
  %z: f32[s0, 8] = add(%y, %x)
  return %z
}
"""


def test_matmul_by_a_weight_is_placed_like_linear(run_pass):
    graph = run_pass(CONV1D_MLP, "shard_tensor_parallel{size=2}").graph
    seeds = {n.inputs[0].name: n.attrs["layout"] for n in graph.nodes if n.op == "shard"}
    assert seeds == {"fc": "tp:S1", "proj": "tp:S0"}  # weights are [in, out] here
    graph = run_pass(print_ir(graph), "propagate_sharding{tp=2}").graph
    assert [n.op for n in graph.nodes].count("all_reduce") == 1
    graph.weight_data.update(_weights(graph, 5))
    x = torch.randn(3, 8)
    want = run_graph(parse_ir(CONV1D_MLP), graph.weight_data, [x])[0]
    ranks = [localize(graph, Mesh(tp=2), r).graph for r in range(2)]
    for (got,) in run_rank_graphs(ranks, [x]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


FUSED_QKV = """\
graph g {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  weight @qkv: f32[24, 8]
  weight @out: f32[8, 8]
  %t: f32[s0, 24] = linear(%x, @qkv, _)
  %q: f32[s0, 8] = slice(%t) {dim=1, start=0, end=8, step=1}
  %k: f32[s0, 8] = slice(%t) {dim=1, start=8, end=16, step=1}
  %v: f32[s0, 8] = slice(%t) {dim=1, start=16, end=24, step=1}
  %qk: f32[s0, 8] = mul(%q, %k)
  %h: f32[s0, 8] = add(%qk, %v)
  %y: f32[s0, 8] = linear(%h, @out, _)
  return %y
}
"""


def test_a_column_split_that_would_be_gathered_stays_whole(run_pass):
    """A fused QKV sliced along the split features would need an all-gather: not split."""
    graph = run_pass(FUSED_QKV, "shard_tensor_parallel{size=2}").graph
    seeds = {n.inputs[0].name: n.attrs["layout"] for n in graph.nodes if n.op == "shard"}
    assert seeds == {"out": "tp:S0"}  # the output projection, gathered once at the end
