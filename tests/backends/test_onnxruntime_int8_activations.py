"""`quantize: {weights: int4, activations: int8}`: MatMulNBits with accuracy_level 4 (inputs
quantized per block, int8 dot products) computes what the op's decomposition says, which rounds
the inputs to the same codes before a float product."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import compiler
import runtime
from backends.onnxruntime import native_ops


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(64, 96), nn.Linear(96, 32, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _compile(tmp_path, backend: str, bits: int, activations: str):
    config = {"quantize": {"weights": f"int{bits}", "group_size": 32,
                           "activations": activations}}
    x = torch.randn(3, 64)
    return compiler.compile(TwoLinears().eval(), (x,), out=tmp_path / f"{backend}.dz",
                            backend=backend, config=config)


@pytest.mark.parametrize("bits", [4, 8])
def test_int8_activations_match_the_decomposition(tmp_path, bits):
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32) * 3
    ort = _compile(tmp_path, "onnxruntime", bits, "int8")
    reference = _compile(tmp_path, "reference", bits, "int8")
    model = onnx.load(str(ort / "backend" / "model.onnx"), load_external_data=False)
    levels = [a.i for n in model.graph.node if n.op_type == "MatMulNBits"
              for a in n.attribute if a.name == "accuracy_level"]
    # int4 with 96 outputs from 64 inputs runs on dayzero's MatMulInt4 where it is built
    # (test_onnxruntime_int4.py); the other product (96 inputs, not a multiple of 64) cannot
    native = [n for n in model.graph.node if n.op_type == "MatMulInt4"]
    assert levels == [4] * (2 - len(native))
    assert len(native) == (1 if bits == 4 and native_ops.library() is not None else 0)
    got, want = runtime.load(ort)(x)[0], runtime.load(reference)(x)[0]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, atol=1e-4 * scale, rtol=0)
    # and the inputs' rounding is really there: float activations give another answer
    plain = runtime.load(_compile(tmp_path / "f", "reference", bits, "float"))(x)[0]
    assert float(np.abs(plain - want).max()) > 1e-4 * scale


def test_the_config_key_reaches_the_pass_and_the_manifest(tmp_path):
    path = _compile(tmp_path, "reference", 4, "int8")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["config"]["quantize"]["activations"] == "int8"
    assert "activations=\"int8\"" in (path / "graph.dzir").read_text()
