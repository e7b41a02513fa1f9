"""Tensor, pipeline and data parallelism on the Llama example, checked on in-process ranks.

The rank graphs run on threads with a shared-memory communicator (tests/passes/parallel_util.py);
tests/runtime/test_distributed.py runs the same partitions on gloo through the launcher.
"""

from __future__ import annotations

import pytest
import sympy
import torch

from compiler.errors import DayzeroError
from compiler.ir import parse_ir, print_ir, symbol
from passes import PassManager
from passes.parallel import Mesh
from passes.parallel.partition import partition
from tests.passes.parallel_util import llama_graph, run_rank_graphs

LAYERS, HIDDEN, VOCAB = 2, 64, 256  # examples/llama.py:build


def _seeds(graph) -> dict[str, str]:
    return {n.inputs[0].name: n.attrs["layout"] for n in graph.nodes
            if n.op == "shard" and graph.is_weight(n.inputs[0])}


def test_megatron_placement_is_found_from_the_dataflow():
    graph, _, _ = llama_graph()
    graph = PassManager("shard_tensor_parallel{size=2}").run(graph)
    seeds = _seeds(graph)
    for layer in range(LAYERS):
        p = f"model.model.layers.{layer}."
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                     "mlp.up_proj"):
            assert seeds.pop(f"{p}{name}.weight") == "tp:S0", name  # column parallel
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            assert seeds.pop(f"{p}{name}.weight") == "tp:S1", name  # row parallel
    assert seeds.pop("model.model.embed_tokens.weight") == "tp:S0"  # vocabulary parallel
    assert seeds.pop("model.lm_head.weight") == "tp:S0"  # logits split by vocabulary
    assert seeds == {}  # norms, rotary tables: replicated


def test_one_all_reduce_per_attention_and_per_mlp_block():
    graph, _, _ = llama_graph()
    graph = PassManager("shard_tensor_parallel{size=2},propagate_sharding{tp=2}").run(graph)
    ops = [n.op for n in graph.nodes]
    # the vocabulary-parallel embedding's sum, then one per attention and one per MLP block
    assert ops.count("all_reduce") == 1 + 2 * LAYERS
    assert ops.count("all_gather") == 1 and ops.count("reduce_scatter") == 0  # the logits
    heads = [n for n in graph.nodes if n.op == "shard" and n.inputs[0].producer is not None
             and n.inputs[0].producer.op == "scaled_dot_product_attention"]
    assert [n.attrs["layout"] for n in heads] == ["tp:S1"] * LAYERS  # heads split


@pytest.mark.parametrize("tp,message", [
    (3, r"'parallel.tensor_parallel' = 3 does not divide the 4 attention heads"),
    (4, r"'parallel.tensor_parallel' = 4 does not divide the 2 heads that reshape %view_1"),
])
def test_heads_not_divisible_by_tensor_parallel_is_an_error(tp, message):
    graph, _, _ = llama_graph()
    with pytest.raises(DayzeroError, match=message):
        partition(graph, Mesh(tp=tp))


MESHES = [Mesh(tp=2), Mesh(pp=2), Mesh(tp=2, pp=2), Mesh(pp=3)]


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_partitioned_llama_matches_one_device(mesh):
    graph, ids, expected = llama_graph()
    plan = partition(graph, mesh)
    outputs = run_rank_graphs([r.graph for r in plan.ranks], [ids])
    last = [out for r, out in zip(plan.ranks, outputs) if r.coords["pp"] == mesh.pp - 1]
    assert len(last) == mesh.dp * mesh.tp
    for (logits,) in last:
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert all(out == [] for r, out in zip(plan.ranks, outputs)
               if r.coords["pp"] != mesh.pp - 1)


@pytest.mark.parametrize("mesh", [Mesh(dp=2), Mesh(dp=2, tp=2, pp=2)], ids=str)
def test_data_parallel_replicas_match_one_device(mesh):
    graph, ids, expected = llama_graph(batch=2)
    plan = partition(graph, mesh)
    outputs = run_rank_graphs([r.graph for r in plan.ranks], [ids])
    for rank, out in zip(plan.ranks, outputs):
        if rank.coords["pp"] == mesh.pp - 1:
            torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)
    weights = {r.rank: r.graph.weight_data for r in plan.ranks}
    twin = mesh.rank(dp=1, pp=0, tp=0)
    assert weights[0].keys() == weights[twin].keys()  # replicas hold the same shards
    assert all(torch.equal(weights[0][k], weights[twin][k]) for k in weights[0])


def test_rank_graphs_hold_only_their_shards_and_round_trip(roundtrip):
    graph, _, _ = llama_graph()
    full = {k: tuple(v.shape) for k, v in graph.weight_data.items()}
    plan = partition(graph, Mesh(tp=2, pp=2))
    stage_weights = []
    for rank in plan.ranks:
        roundtrip(print_ir(rank.graph))
        shapes = {k: tuple(v.shape) for k, v in rank.graph.weight_data.items()}
        q = "model.model.layers.0.self_attn.q_proj.weight"
        if q in shapes:
            assert shapes[q] == (full[q][0] // 2, full[q][1])
        stage_weights.append(set(shapes))
    # stages share at most small tables both recompute from (the rotary frequencies); no
    # projection or embedding is held twice
    shared = stage_weights[0] & stage_weights[2]
    assert all(graph.weight_data[k].numel() <= 4096 for k in shared), shared


S0 = symbol("s0")


def _expr(text) -> sympy.Expr:
    return sympy.sympify(text, locals={"s0": S0})


def _analytic_block_bytes(batch=1) -> sympy.Expr:
    """One all-reduce of the residual stream: batch x seq x hidden x 4 bytes (f32)."""
    return batch * S0 * HIDDEN * 4


def test_communication_report_equals_the_analytic_count():
    graph, _, _ = llama_graph()
    report = partition(graph, Mesh(tp=2)).communication()
    block = _analytic_block_bytes()
    for rank in report["ranks"]:
        ar = rank["by_op"]["all_reduce"]
        assert ar["count"] == 1 + 2 * LAYERS  # embedding + (attention, MLP) per layer
        assert _expr(ar["bytes"]) == (1 + 2 * LAYERS) * block
        assert rank["by_op"]["all_gather"] == {"count": 1, "bytes": str(VOCAB * 4 * S0)}
        per_block = [c for c in rank["collectives"] if c["op"] == "all_reduce"]
        assert all(_expr(c["bytes"]) == block for c in per_block)
        # ring all-reduce over 2 ranks sends 2(n-1)/n = 1 payload; all-gather (n-1)/n of it
        assert _expr(rank["wire_bytes"]) == (1 + 2 * LAYERS) * block + VOCAB * 2 * S0
    assert report["total"]["count"] == 2 * (2 + 2 * LAYERS)


def test_pipeline_transfers_pair_up_between_stages():
    graph, _, _ = llama_graph()
    plan = partition(graph, Mesh(tp=2, pp=2))
    for tp in range(2):
        sender, receiver = plan.ranks[tp].graph, plan.ranks[2 + tp].graph
        sends = [(n.attrs["peer"], n.attrs["tag"], n.inputs[0].type) for n in sender.nodes
                 if n.op == "send"]
        recvs = [(n.attrs["peer"], n.attrs["tag"], n.output.type) for n in receiver.nodes
                 if n.op == "recv"]
        assert sends and [(t, ty) for _, t, ty in sends] == [(t, ty) for _, t, ty in recvs]
        assert {p for p, _, _ in sends} == {2 + tp} and {p for p, _, _ in recvs} == {tp}
    # position ids, rotary tables and the causal mask are recomputed, not sent
    sent = {n.inputs[0].name for n in plan.ranks[0].graph.nodes if n.op == "send"}
    assert not any(name.startswith(("bitwise_and", "cos", "sin", "mul_85", "mul_92"))
                   for name in sent)


def test_annotated_global_graph_round_trips(roundtrip):
    graph, _, _ = llama_graph()
    plan = partition(graph, Mesh(tp=2, pp=2))
    text = print_ir(plan.graph)
    assert print_ir(parse_ir(text)) == text
    roundtrip(text)
