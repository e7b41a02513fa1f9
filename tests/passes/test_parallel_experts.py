"""Expert parallelism: a `moe` op's experts split over ranks, in one process (ThreadWorld).

IR text in, rank programs out; the dispatch and combine ops on hand-checked routings (empty
slices and ranks that receive nothing included); partitioned numerics against one device for
several group sizes and token counts; each rank keeping only its experts' weights; the config
errors. The gloo runs on transformers' Mixtral are in tests/runtime/test_distributed_experts*.py.
"""

from __future__ import annotations

import pytest
import torch

from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.ir import DType, TensorType, get_op, parse_ir, print_ir
from compiler.ir.ops import ShapeError
from passes.parallel import Mesh, partition
from passes.parallel.report import communication_report
from tests.passes.parallel_util import run_rank_programs, run_ranks

BLOCK = """graph moe_block {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  weight @router: f32[4, 8]
  weight @router_b: f32[4]
  weight @gate_up: f32[4, 8, 12]
  weight @down: f32[4, 6, 8]
  weight @gate_up_b: f32[4, 12]
  weight @down_b: f32[4, 8]
  %logits: f32[s0, 4] = linear(%x, @router, @router_b)
  %y: f32[s0, 8] = moe(%x, %logits, @gate_up, @down, @gate_up_b, @down_b, _) {top_k=2, normalize=true}
  %out: f32[s0, 8] = add(%y, %x)
  return %out
}
"""  # noqa: E501

RANK1 = """graph moe_block_rank1 {
  symbol s0 in [1, 64]
  symbol ep_rows0 in [0, 128]
  input %x: f32[s0, 8]
  weight @router: f32[4, 8]
  weight @router_b: f32[4]
  weight @gate_up: f32[2, 8, 12]
  weight @down: f32[2, 6, 8]
  weight @gate_up_b: f32[2, 12]
  weight @down_b: f32[2, 8]
  %logits: f32[s0, 4] = linear(%x, @router, @router_b)
  %softmax: f32[s0, 4] = softmax(%logits) {dim=-1}
  %topk: f32[s0, 2], %topk_0: i64[s0, 2] = topk(%softmax) {k=2, dim=-1, largest=true, sorted=true}
  %sum: f32[s0, 1] = sum(%topk) {dims=[-1], keepdim=true}
  %div: f32[s0, 2] = div(%topk, %sum) {rounding_mode=none}
  %y.rows: f32[ep_rows0, 8], %y.experts: i64[ep_rows0], %y.sources: i64[2] = expert_dispatch(%x, %topk_0) {axis="ep", experts=4, rows="ep_rows0", ranks=[0, 1]}
  %reshape: i64[ep_rows0, 1] = reshape(%y.experts) {shape=[ep_rows0, 1]}
  %arange: i64[2] = arange() {start=0, end=2, step=1, dtype=i64}
  %eq: bool[ep_rows0, 2] = eq(%reshape, %arange)
  %cast: f32[ep_rows0, 2] = cast(%eq) {dtype=f32}
  %y.local: f32[ep_rows0, 8] = moe(%y.rows, %cast, @gate_up, @down, @gate_up_b, @down_b, _) {top_k=1, routing="topk_softmax", normalize=false, normalize_eps=0.0, scale=1.0, activation="silu", n_group=1, topk_group=1, group_top=1, group_fill=-inf}
  %y: f32[s0, 8] = expert_combine(%y.local, %y.sources, %div, %topk_0) {axis="ep", experts=4, ranks=[0, 1]}
  %out: f32[s0, 8] = add(%y, %x)
  return %out
}
"""  # noqa: E501


def block(seed: int = 0, router_bias=None):
    graph = parse_ir(BLOCK)
    gen = torch.Generator().manual_seed(seed)
    graph.weight_data = {name: torch.randn(*[int(d) for d in v.type.shape], generator=gen)
                         for name, v in graph.weights.items()}
    if router_bias is not None:
        graph.weight_data["router_b"] = torch.tensor(router_bias)
    return graph


def test_each_rank_routes_dispatches_computes_its_experts_and_combines():
    plan = partition(block(), Mesh(ep=2))
    assert "= shard(@gate_up) {layout=\"ep:S0\"}" in print_ir(plan.graph)
    assert print_ir(plan.ranks[1].graph) == RANK1
    assert plan.manifest()["groups"] == {"ep": [[0, 1]]}


@pytest.mark.parametrize("ep,tokens", [(2, 7), (2, 1), (4, 3), (4, 9), (4, 1)])
def test_partitioned_moe_matches_one_device(ep, tokens):
    graph = block(seed=tokens)
    x = torch.randn(tokens, 8, generator=torch.Generator().manual_seed(ep))
    want = run_graph(graph, graph.weight_data, [x])[0]
    plan = partition(graph, Mesh(ep=ep))
    for (got,) in run_rank_programs([r.graph for r in plan.ranks], [x]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_rank_that_receives_no_rows_still_takes_part():
    """Router biases that always choose experts 0 and 1: rank 1 owns neither, gets no rows."""
    graph = block(router_bias=[50.0, 40.0, -50.0, -50.0])
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    want = run_graph(graph, graph.weight_data, [x])[0]
    plan = partition(graph, Mesh(ep=2))
    for (got,) in run_rank_programs([r.graph for r in plan.ranks], [x]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_each_rank_stores_only_its_experts():
    graph = block()
    full = dict(graph.weight_data)
    plan = partition(graph, Mesh(ep=2))
    for program in plan.ranks:
        r, data = program.rank, program.graph.weight_data
        for name in ("gate_up", "down", "gate_up_b", "down_b"):
            assert torch.equal(data[name], full[name][2 * r:2 * r + 2]), name
        assert torch.equal(data["router"], full["router"])  # the router is replicated


def _dispatch_combine(rank, x, indices, weights, y_of):
    """Dispatch on `rank` of a group [0, 1] with 4 experts, combine y_of(rows, ids)."""
    dispatch, combine = get_op("expert_dispatch"), get_op("expert_combine")
    rows, ids, sources = dispatch.reference(x, indices, axis="ep", experts=4, rows="r",
                                            ranks=[0, 1])
    out = combine.reference(y_of(rows, ids), sources, weights, indices, axis="ep", experts=4,
                            ranks=[0, 1])
    return rows[:, 0].tolist(), ids.tolist(), sources.tolist(), out


def test_dispatch_sends_each_pair_to_the_owner_of_its_expert():
    # rank 0 dispatches token 0, rank 1 tokens 1 and 2 (slices [0, 1) and [1, 3))
    x = torch.tensor([[10.0], [11.0], [12.0]])
    indices = torch.tensor([[0, 3], [2, 1], [3, 0]])
    weights = torch.tensor([[0.5, 0.25], [1.0, 2.0], [4.0, 8.0]])
    results = run_ranks(2, lambda r: _dispatch_combine(r, x, indices, weights,
                                                       lambda rows, ids: rows + 100 * ids[:, None]))
    # rank 0 owns experts 0 and 1: from rank 0 token 0 (e0); from rank 1, in expert order,
    # token 2 (e0) then token 1 (e1). Rank 1 owns 2 and 3 (local 0 and 1).
    assert results[0][:3] == ([10.0, 12.0, 11.0], [0, 0, 1], [1, 2])
    assert results[1][:3] == ([10.0, 11.0, 12.0], [1, 0, 1], [1, 2])
    # each row comes back as x + 100 * its expert's local id, weighted and summed per token
    want = torch.tensor([[0.5 * 10 + 0.25 * 110], [1.0 * 11 + 2.0 * 111],
                         [4.0 * 112 + 8.0 * 12]])
    for _, _, _, out in results:
        torch.testing.assert_close(out, want)


def test_expert_ops_exist_only_for_a_group_of_ranks():
    x, idx = TensorType(DType.f32, (5, 8)), TensorType(DType.i64, (5, 2))
    with pytest.raises(ShapeError, match="two or more ranks"):
        get_op("expert_dispatch").infer([x, idx], {"axis": "ep", "experts": 4, "rows": "r",
                                                   "ranks": [0]})
    with pytest.raises(ShapeError, match="multiple of the 3 ranks"):
        get_op("expert_dispatch").infer([x, idx], {"axis": "ep", "experts": 4, "rows": "r",
                                                   "ranks": [0, 1, 2]})


def test_communication_report_counts_the_rows_that_move():
    plan = partition(block(), Mesh(ep=2))
    entries = communication_report({1: plan.ranks[1].graph})["ranks"][0]["collectives"]
    assert [(e["op"], e["bytes"], e["wire_bytes"]) for e in entries] == [
        ("expert_dispatch", "32*ep_rows0", "16*ep_rows0"),
        ("expert_combine", "32*ep_rows0", "16*ep_rows0 + 16*s0")]


def test_the_mesh_puts_experts_on_the_tensor_parallel_ranks():
    mesh = Mesh(tp=2, ep=2, pp=2)
    assert mesh.world_size == 4
    assert mesh.coords(3) == {"dp": 0, "pp": 1, "tp": 1, "ep": 1}
    assert mesh.group(3, "ep") == mesh.group(3, "tp") == [2, 3]
    alone = Mesh(ep=4)
    assert alone.world_size == 4 and alone.coords(2) == {"dp": 0, "pp": 0, "tp": 0, "ep": 2}
    assert alone.group(2, "ep") == [0, 1, 2, 3] and alone.group(2, "tp") == [2]


@pytest.mark.parametrize("mesh,message", [
    (dict(ep=3), "config key 'parallel.expert_parallel' = 3 does not divide the 4 experts of "
                 "moe %y"),
    (dict(ep=8), "'parallel.expert_parallel' = 8 does not divide the 4 experts of moe %y"),
])
def test_experts_not_divisible_by_expert_parallel_is_an_error(mesh, message):
    with pytest.raises(DayzeroError) as info:
        partition(block(), Mesh(**mesh))
    assert message in str(info.value)
    assert "moe(%x, %logits" in str(info.value)  # the node


def test_expert_and_tensor_parallel_of_different_sizes_is_an_error():
    with pytest.raises(DayzeroError, match="'parallel.expert_parallel' = 2 differs from "
                                           "'parallel.tensor_parallel' = 4"):
        Mesh(tp=4, ep=2)


def test_expert_parallel_without_a_moe_op_is_an_error():
    graph = parse_ir("graph g {\n  input %x: f32[2, 4]\n  %y: f32[2, 4] = relu(%x)\n"
                     "  return %y\n}\n")
    with pytest.raises(DayzeroError, match="expert_parallel' = 2, but the graph has no moe op"):
        partition(graph, Mesh(ep=2))


@pytest.mark.parametrize("mesh", [dict(dp=2, ep=2), dict(pp=2, ep=2), dict(dp=2, tp=2, ep=2)],
                         ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()))
def test_expert_parallel_composes_with_data_and_pipeline_parallel(mesh):
    graph = parse_ir(BLOCK.replace("  symbol s0 in [1, 64]\n", "").replace("s0", "6"))
    gen = torch.Generator().manual_seed(5)
    graph.weight_data = {name: torch.randn(*v.type.shape, generator=gen)
                         for name, v in graph.weights.items()}
    x = torch.randn(6, 8, generator=gen)
    want = run_graph(graph, graph.weight_data, [x])[0]
    plan = partition(graph, Mesh(**mesh))
    if "dp" in mesh:  # each data-parallel replica's expert group dispatches its own tokens
        assert "expert_dispatch(%x.dp.dp1, " in print_ir(plan.ranks[2].graph)
    outputs = [o for o in run_rank_programs([r.graph for r in plan.ranks], [x]) if o]
    assert len(outputs) == (2 if "pp" in mesh else 4)
    for (got,) in outputs:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_compile_refuses_experts_that_do_not_divide(tmp_path):
    from compiler.config import load_config
    from compiler.driver import _backend, lower_and_write
    from compiler.log import SILENT

    with pytest.raises(DayzeroError) as info:
        lower_and_write(block(), tmp_path / "m.dz", _backend("reference"),
                        load_config({"parallel": {"expert_parallel": 3}}), passes=None,
                        dump_ir=None, force=False, log=SILENT)
    assert "'parallel.expert_parallel' = 3 does not divide the 4 experts of moe %y" in \
        info.value.message()
    assert not (tmp_path / "m.dz").exists()


def test_expert_parallel_config_values_are_checked():
    from compiler.config import load_config
    from compiler.generation import check_parallel

    with pytest.raises(DayzeroError, match="'parallel.expert_parallel' has impossible value 0"):
        load_config({"parallel": {"expert_parallel": 0}})
    with pytest.raises(DayzeroError, match="'parallel.expert_parallel' = 2: a generation"):
        check_parallel(load_config({"parallel": {"expert_parallel": 2}}).parallel)
