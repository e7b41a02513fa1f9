"""Small integer weights are inline in model.onnx: ORT's shape inference reads them as data, and
after ConstantSharing merged one with a Slice's axes a Falcon artifact did not load."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import torch

import compiler
import runtime
from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, TensorType, symbol
from tests.backends.onnxruntime_util import check_onnx, compile_graph, load

S = symbol("s0")


def test_small_integer_weights_are_inline_and_the_rest_external(tmp_path):
    g = Graph()
    g.symbols["s0"] = (2, 64)
    x = g.add_input("x", TensorType(DType.f32, (1, S, 4, 16)))
    index = g.add_weight("index", TensorType(DType.i64, (1,)), torch.tensor([-1]))
    scale = g.add_weight("scale", TensorType(DType.f32, (16,)), torch.linspace(-1, 1, 16))
    eps = g.add_weight("eps", TensorType(DType.f32, ()), torch.tensor(1e-5))
    picked = g.add_node("index", [x, None, None, index]).output
    part = g.add_node("slice", [x], {"dim": -1, "start": 8, "end": 16, "step": 1}).output
    shifted = g.add_node("add", [g.add_node("mul", [x, scale]).output, eps]).output
    g.outputs = [picked, shifted, part]
    path = compile_graph(g, tmp_path / "m.dz")
    model = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False)
    where = {t.name: t.data_location for t in model.graph.initializer}
    assert where["index"] == where["eps"] == onnx.TensorProto.DEFAULT  # tiny: inline
    assert where["scale"] == onnx.TensorProto.EXTERNAL
    check_onnx(path)
    xx = np.random.default_rng(0).standard_normal((1, 5, 4, 16)).astype(np.float32)
    for got, want in zip(load(path)([xx]), run_graph(g, g.weight_data, [xx])):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def test_two_layer_falcon_with_a_dynamic_sequence_loads_and_matches_eager(tmp_path):
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    config = FalconConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, multi_query=True, parallel_attn=True,
                          bias=False, alibi=False, new_decoder_architecture=False,
                          max_position_embeddings=64, attn_implementation="sdpa")
    model = _Logits(FalconForCausalLM(config).eval())
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the frontend's notes on transformers internals
        path = compiler.compile(model, (ids,), out=tmp_path / "falcon.dz", backend="onnxruntime",
                                dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},))
    loaded = runtime.load(path)
    for n in (5, 13):  # one artifact, two sequence lengths
        prompt = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            want = model(prompt).numpy()
        got = loaded(prompt)[0]
        assert got.shape == (1, n, 256)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
