"""Fusion on the bundled transformers examples: every norm, attention and gated MLP is recognised
(none left in decomposed form), and the fused graph still matches torch eager within 1e-4."""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import compiler
from backends.reference.interpreter import run_graph
from compiler.ir import Graph, parse_ir, print_ir
from passes import DEFAULT_PIPELINE, PassManager
from passes.fusion.report import fusion_report, op_counts, records_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NORMS = ("rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm")
# ops that only appear in the decomposed forms of norms, attention and activations
DECOMPOSED = ("pow", "rsqrt", "sqrt", "var", "softmax", "erf", "tanh", "sigmoid")


def build(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


@dataclass
class Fused:
    name: str
    layers: int
    eager: list
    inputs: tuple
    unfused: Graph
    graph: Graph
    records: list
    report: str

    def count(self) -> Counter:
        return Counter(n.op for n in self.graph.nodes)


@pytest.fixture(scope="module", params=["llama", "gpt2", "bert", "vit", "llama_eager",
                                        "gpt2_eager"])
def fused(request) -> Fused:
    """An example exported, cleaned up and fused; `_eager` ones use transformers' eager
    attention (the explicit softmax(QK^T * scale + mask) V form) instead of sdpa."""
    name = request.param.removesuffix("_eager")
    model, inputs, dynamic = build(name)
    if request.param.endswith("_eager"):
        model.model.config._attn_implementation = "eager"
    layers = model.model.config.num_hidden_layers
    with torch.no_grad():  # before exporting: tracing must not be what eager is compared with
        eager = model(*inputs)
    eager = [eager] if isinstance(eager, torch.Tensor) else list(eager)
    graph = PassManager(DEFAULT_PIPELINE).run(compiler.export(model, inputs, dynamic))
    unfused = parse_ir(print_ir(graph))
    unfused.weight_data = dict(graph.weight_data)
    before = op_counts(graph)
    manager = PassManager("fuse,fuse_groups")
    graph = manager.run(graph)
    records = records_of(manager)
    return Fused(name, layers, eager, inputs, unfused, graph, records,
                 str(fusion_report(before, graph, records)))


def test_every_norm_and_attention_is_fused(fused):
    count, n = fused.count(), fused.layers
    assert sum(count[op] for op in NORMS) == 2 * n + 1, count
    assert count["scaled_dot_product_attention"] + count["multi_head_attention"] == n
    assert not [op for op in DECOMPOSED if count[op]], count
    assert count["mean"] == 0 and count["matmul"] == 0, count
    # every norm reading a residual add takes it in; the first one of llama, bert and vit reads
    # the embeddings (bert and vit add position embeddings by broadcasting, which is no residual)
    residual = {"llama": 2 * n, "gpt2": 2 * n + 1, "bert": 2 * n, "vit": 2 * n}[fused.name]
    assert count["add_rms_norm"] + count["add_layer_norm"] == residual


def test_decoder_specific_fusions(fused):
    count, n, nodes = fused.count(), fused.layers, fused.graph.nodes
    if fused.name == "llama":
        # the whole block (head split, rotary on q and k, GQA attention, merge) is one node
        attention = [node for node in nodes if node.op == "multi_head_attention"]
        assert count["gated_mlp"] == n and len(attention) == n
        assert all(node.inputs[3] is not None for node in attention)  # rotary inside
        assert all(node.attrs["kv_num_heads"] < node.attrs["num_heads"]  # repeat_kv removed
                   for node in attention)
        assert Counter(r.rule for r in fused.records)["merge_linears"] == n  # q/k/v per layer
    elif fused.name == "gpt2":
        # Conv1D: matmul + bias (+ gelu) become fused_linear with the weight as stored
        assert count["fused_linear"] == 4 * n
        assert sum(node.attrs.get("activation") == "gelu_tanh" for node in nodes) == n
    else:
        assert sum(node.attrs.get("activation") == "gelu" for node in nodes) == n


def test_fused_nodes_say_where_they_came_from(fused):
    fused_nodes = [n for n in fused.graph.nodes if "origin" in n.attrs]
    assert fused_nodes and all(n.loc for n in fused_nodes)
    assert len(fused.records) >= len(fused_nodes) // 2
    assert "patterns fired:" in fused.report
    text = print_ir(fused.graph)
    assert print_ir(parse_ir(text)) == text


def test_fused_graph_matches_unfused_and_eager(fused):
    got = run_graph(fused.graph, fused.graph.weight_data, list(fused.inputs))
    base = run_graph(fused.unfused, fused.unfused.weight_data, list(fused.inputs))
    assert len(got) == len(fused.eager)
    for g, b, e in zip(got, base, fused.eager):
        torch.testing.assert_close(g, b, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


class _LastHiddenState(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixels):
        return self.model(pixels).last_hidden_state


def test_clip_vision_quick_gelu_is_fused():
    """CLIP's towers (LLaVA's vision encoder too) use QuickGELU, x * sigmoid(1.702 x): one fused
    op per layer, no sigmoid left, the same values as eager."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(0)
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, image_size=32, patch_size=8)
    assert config.hidden_act == "quick_gelu"
    model = CLIPVisionModel(config).eval()
    pixels = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = model(pixels).last_hidden_state
    graph = PassManager(DEFAULT_PIPELINE + ",fuse").run(
        compiler.export(_LastHiddenState(model), (pixels,)))
    ops = Counter(n.op for n in graph.nodes)
    assert ops["quick_gelu"] == 2 and ops["sigmoid"] == 0
    assert {n.attrs["alpha"] for n in graph.nodes if n.op == "quick_gelu"} == {1.702}
    (got,) = run_graph(graph, graph.weight_data, [pixels])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def test_qwen3_per_head_norms_fuse_into_the_attention_block(tmp_path):
    """Qwen3 RMS-normalizes each head of q and k (q_norm, k_norm) between the split and the
    rotary: the block still becomes one multi_head_attention (the norms kept on the [b, s, h*d]
    projections), onnxruntime runs it on CausalAttention, and the logits match transformers."""
    import json

    from transformers import Qwen3Config, Qwen3ForCausalLM

    import runtime

    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                         head_dim=16)
    model = _Logits(Qwen3ForCausalLM(config).eval())
    ids = torch.randint(0, 256, (1, 8))
    seq = torch.export.Dim("seq", min=2, max=64)
    graph = PassManager(DEFAULT_PIPELINE + ",fuse").run(
        compiler.export(model, (ids,), ({1: seq},)))
    attention = [n for n in graph.nodes if n.op == "multi_head_attention"]
    assert len(attention) == 2 and all(n.inputs[3] is not None for n in attention)  # rotary
    assert not [n for n in graph.nodes if n.op in ("permute", "rotary_embedding")]
    path = compiler.compile(model, (ids,), tmp_path / "qwen3.dz", dynamic_shapes=({1: seq},))
    lowering = json.loads((path / "backend" / "lowering.json").read_text())
    assert any("CausalAttention" in v or "GroupQueryAttention" in v for v in lowering["variants"])
    loaded = runtime.load(path)
    for length in (2, 9, 40):
        x = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = model(x).numpy()
        got = loaded(x.numpy())[0]
        assert abs(got - want).max() <= 1e-5 * max(1.0, abs(want).max())
