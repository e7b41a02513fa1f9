"""Expert parallelism on real ranks: transformers' Mixtral (tiny: hidden 32, 2 layers, 4 experts
top-2) compiled for onnxruntime with `parallel: {expert_parallel: 2}` and with expert and tensor
parallelism on the same two ranks, each run on two gloo ranks started by torch.distributed's
launcher, against the one-process artifact and eager within 1e-5; each rank's weight files
holding only its two experts; the same rank programs in one process (threads) at lengths where a
rank dispatches no tokens and may receive no rows.

One export and one launch per config (each launch starts two processes that import torch).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch

import runtime
from passes import DEFAULT_PIPELINE, PassManager
from passes.parallel.shard_expert_parallel import with_moe_fusion
from runtime.artifact import open_artifact
from runtime.distributed import LaunchedModel
from runtime.rank_exec import RankExecutor
from runtime.specs import specs_from_manifest
from runtime.validate import prepare_inputs
from tests.numerics import assert_fp32_close
from tests.passes.parallel_util import run_ranks
from tests.runtime.experts_util import SEQ, compile_mixtral, eager_logits, mixtral_graph, token_ids

CONFIGS = {"ep2": {"expert_parallel": 2}, "ep2tp2": {"expert_parallel": 2, "tensor_parallel": 2}}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("experts")
    paths = {name: compile_mixtral(root / f"{name}.dz", parallel)
             for name, parallel in CONFIGS.items()}
    return {"one": compile_mixtral(root / "one.dz"), **paths}


@functools.cache
def _one_process(path) -> np.ndarray:
    return runtime.load(path)(token_ids(SEQ))[0]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_two_gloo_ranks_match_one_process_and_eager(artifacts, name):
    ids = token_ids(SEQ)
    model = runtime.load(artifacts[name], timeout=60)
    assert isinstance(model, LaunchedModel) and model.nproc == 2
    (got,) = model(ids)
    np.testing.assert_allclose(got, _one_process(artifacts["one"]), rtol=1e-5, atol=1e-5)
    assert_fp32_close(got, eager_logits(ids), what=f"logits at seq {SEQ}")


def test_each_rank_stores_only_its_experts(artifacts):
    graph = PassManager(with_moe_fusion(DEFAULT_PIPELINE)).run(mixtral_graph())
    full = {k: np.asarray(v) for k, v in graph.weight_data.items()}
    experts = {v.name for n in graph.nodes if n.op == "moe" for v in n.inputs[2:4]}
    assert len(experts) == 4  # gate_up and down of both layers
    stored = []
    for rank in range(2):
        weights = open_artifact(artifacts["ep2"], rank=rank).weights("np", rank=rank)
        assert set(weights) == set(full)
        for name, data in weights.items():
            want = full[name][2 * rank:2 * rank + 2] if name in experts else full[name]
            np.testing.assert_array_equal(data, want, err_msg=name)
        stored.append(sum(w.nbytes for w in weights.values()))
    expert_bytes = sum(full[name].nbytes for name in experts)
    total = sum(w.nbytes for w in full.values())
    assert stored == [total - expert_bytes // 2] * 2


def test_attention_is_split_by_heads_and_the_moe_by_experts(artifacts):
    text = open_artifact(artifacts["ep2tp2"], rank=1).graph_text(1)
    assert "weight @model.model.layers.0.self_attn.q_proj.weight: f32[16, 32]" in text
    assert text.count("= expert_dispatch(") == 2 and text.count("= expert_combine(") == 2
    assert "f32[2, 32, 64]" in text and "f32[4, 32, 64]" not in text  # 2 of the 4 experts


@functools.cache
def _programs(path):
    opened = [open_artifact(path, rank=r) for r in range(2)]
    specs = specs_from_manifest(opened[0].manifest, "inputs")
    return [RankExecutor(a, r) for r, a in enumerate(opened)], specs


@pytest.mark.parametrize("seq", [1, 2])
def test_rank_programs_in_one_process_match_eager(artifacts, seq):
    """seq 1: rank 0's token slice is empty, and one rank may receive no rows at all."""
    programs, specs = _programs(artifacts["ep2"])
    ids = token_ids(seq)
    arrays, bindings = prepare_inputs(specs, [ids])
    for (got,) in run_ranks(2, lambda r: programs[r](arrays, bindings)):
        assert_fp32_close(torch.as_tensor(got), eager_logits(ids), what=f"logits at seq {seq}")


def test_a_rank_without_rows_runs_its_experts_on_onnxruntime(tmp_path):
    """Router biases that always choose experts 0 and 1: rank 1's com.microsoft.MoE segment
    gets zero rows, and both ranks still return the one-device result."""
    from backends.reference.interpreter import run_graph
    from compiler.config import load_config
    from compiler.driver import _backend, lower_and_write
    from compiler.log import SILENT
    from tests.passes.test_parallel_experts import block

    graph = block(router_bias=[50.0, 40.0, -50.0, -50.0])
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    want = run_graph(graph, graph.weight_data, [x])[0]
    path = lower_and_write(graph, tmp_path / "m.dz", _backend("onnxruntime"),
                           load_config({"parallel": {"expert_parallel": 2}}), passes=None,
                           dump_ir=None, force=False, log=SILENT)
    programs, specs = _programs(path)
    segments = sorted((path / "backend" / "rank-1").rglob("*.onnx"))
    assert "MoE" in {node.op_type for f in segments
                     for node in onnx.load(str(f), load_external_data=False).graph.node}
    arrays, bindings = prepare_inputs(specs, [x])
    for (got,) in run_ranks(2, lambda r: programs[r](arrays, bindings)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
