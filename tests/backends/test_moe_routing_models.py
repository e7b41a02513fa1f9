"""Whole MoE blocks as one `moe` op: shared experts and DeepSeek's routing, end to end.

transformers' own classes with tiny configs (hidden 64, 2 layers, 8 experts): Qwen2-MoE (a
sigmoid-gated shared expert), DeepSeek-V3 (sigmoid scores, `e_score_correction_bias`, groups of
experts scored by their best two, `norm_topk_prob`, `routed_scaling_factor`, a shared expert) and
DeepSeek-V2 (softmax scores, group-limited greedy: groups scored by their best, the rest filled
with 0, a scale). Each compiles to exactly one `moe` per MoE layer (the routing and the shared
expert inside it, nothing of the block left beside it), runs on onnxruntime (com.microsoft.MoE,
routing and shared expert around it) and on the reference backend (the op's decomposition), and
matches eager within 1e-5 at two sequence lengths. The bias and the router are randomised so
that the bias changes which experts are chosen and groups matter.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch.export import Dim
from transformers import AutoConfig, AutoModelForCausalLM

import compiler
import runtime
from compiler.hf_models import wrap_pretrained
from compiler.ir import parse_ir
from tests.numerics import assert_fp32_close
from tests.sweeps import sweep

TINY = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=128)
DEEPSEEK = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=0,
                kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                v_head_dim=16, norm_topk_prob=True, routed_scaling_factor=2.5)
CONFIGS = {
    "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, norm_topk_prob=False),
    "deepseek_v3": DEEPSEEK,
    "deepseek_v2": {**DEEPSEEK, "topk_method": "group_limited_greedy", "norm_topk_prob": False,
                    "routed_scaling_factor": 1.5},
}
# the attributes each block's moe must carry
EXPECTED = {
    "qwen2_moe": dict(routing="softmax_topk", normalize=False, n_group=1),
    "deepseek_v3": dict(routing="sigmoid_topk", normalize=True, normalize_eps=1e-20, scale=2.5,
                        n_group=4, topk_group=2, group_top=2, group_fill=float("-inf")),
    "deepseek_v2": dict(routing="softmax_topk", normalize=False, scale=1.5, n_group=4,
                        topk_group=2, group_top=1, group_fill=0.0),
}


def tiny(model_type: str) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **TINY, **CONFIGS[model_type])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):  # a router that spreads tokens over groups
                p.normal_(0.0, 0.5)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape) * 0.2)
    return model


def _compile(model_type: str, backend: str, out):
    hf = tiny(model_type)
    module, inputs = wrap_pretrained(hf, {"input_ids": torch.randint(0, 128, (1, 8))}, model_type)
    passes = ("remove_noops,fold_constants,eliminate_common_subexpressions,"
              "recognize_causal_masks,eliminate_dead_code,fuse,eliminate_dead_code")
    compiler.compile(module, inputs, out, backend=backend, passes=passes,
                     dynamic_shapes=({1: Dim("seq", max=64)},))
    return hf, runtime.load(out)


def _block_is_one_moe(model_type: str, out) -> None:
    graph = parse_ir((out / "graph.dzir").read_text())
    moes = [n for n in graph.nodes if n.op == "moe"]
    assert len(moes) == 2, f"{len(moes)} moe ops for 2 MoE layers"
    for node in moes:
        assert node.inputs[7] is not None and node.inputs[9] is not None  # the shared expert
        assert (node.inputs[10] is not None) == (model_type == "qwen2_moe")  # its sigmoid gate
        assert (node.inputs[6] is not None) == (model_type == "deepseek_v3")  # the score bias
        for key, value in EXPECTED[model_type].items():
            assert node.attrs[key] == value, (key, node.attrs[key])
    # nothing of the blocks is left beside them: no router top-k, no grouped matmul, no MLP
    left = {n.op for n in graph.nodes} & {"topk", "grouped_matmul", "gated_mlp", "sigmoid",
                                           "scatter", "sort"}
    assert not left, left


# Each case exports a 2-layer model (15-25 s of CPU): CI runs these two, `pytest --sweep` all
ALWAYS = {"onnxruntime-deepseek_v3", "reference-qwen2_moe"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        cases = [f"{backend}-{name}" for backend in ("onnxruntime", "reference")
                 for name in sorted(CONFIGS)]
        metafunc.parametrize("case", sweep(metafunc.config, cases, str, always=ALWAYS))


def test_moe_block_is_one_op_and_matches_eager(case, tmp_path):
    backend, model_type = case.split("-", 1)
    out = tmp_path / "m.dz"
    hf, model = _compile(model_type, backend, out)
    _block_is_one_moe(model_type, out)
    for seq in (5, 13):
        ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(seq))
        with torch.no_grad():
            want = hf(input_ids=ids, use_cache=False).logits
        assert_fp32_close(model(ids)[0], want, what=f"logits at seq {seq}")
    if backend == "onnxruntime":
        nodes = onnx.load(str(out / "backend" / "model.onnx"), load_external_data=False).graph.node
        assert [(n.domain, n.op_type) for n in nodes].count(("com.microsoft", "MoE")) == 2
