"""runtime.load and CompiledModel: specs, conversion of inputs and outputs, backend lookup."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from compiler.errors import DayzeroError, InputError
from compiler.ir import DType, Graph, TensorType, symbol
from compiler.writer import write_artifact
from runtime import TensorSpec
from runtime.validate import OutputShapeError


@pytest.fixture
def mlp(tmp_path, make_mlp):
    g = make_mlp(0)
    return g, runtime.load(write_artifact(tmp_path / "m.dz", g, "reference"))


def test_specs(mlp):
    _, m = mlp
    assert m.input_specs == [TensorSpec("x", "f32", ("s0", 4), {"s0": (2, 64)})]
    assert m.output_specs == [TensorSpec("y", "f32", ("s0", 3), {"s0": (2, 64)})]
    assert str(m.input_specs[0]) == "x: f32[s0, 4]"
    assert m.backend.name == "reference"


@pytest.mark.parametrize("rows", [2, 5, 64])
def test_numpy_and_torch_inputs_match_eager(mlp, mlp_reference, rows):
    g, m = mlp
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(rows))
    expected = mlp_reference(g, x).numpy()
    for given in (x, x.numpy(), x.t().contiguous().t(), x.clone().requires_grad_(True)):
        outputs = m(given)
        assert isinstance(outputs, tuple) and len(outputs) == 1
        assert isinstance(outputs[0], np.ndarray) and outputs[0].dtype == np.float32
        np.testing.assert_allclose(outputs[0], expected, rtol=1e-5, atol=1e-5)


def test_non_contiguous_input(mlp, mlp_reference):
    g, m = mlp
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32).T[::2]
    np.testing.assert_allclose(m(x)[0], mlp_reference(g, torch.from_numpy(x.copy())).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_invalid_input_is_refused_before_running(mlp):
    _, m = mlp
    with pytest.raises(InputError, match=r"input 'x' dim 0 is 65 but s0 must be in \[2, 64\]"):
        m(np.zeros((65, 4), np.float32))
    with pytest.raises(InputError, match="input 'x' has dtype f64"):
        m(torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\), got 0"):
        m()


def test_bf16_inputs_and_outputs(tmp_path):
    g = Graph()
    g.symbols["s0"] = (1, 8)
    x = g.add_input("x", TensorType(DType.bf16, (symbol("s0"), 3)))
    w = g.add_weight("w", TensorType(DType.bf16, (3,)), torch.tensor([1.5, -2.0, 0.25]).bfloat16())
    y = g.add_node("mul", [x, w], names=["y"]).output
    g.outputs = [y, g.add_node("cast", [y], {"dtype": DType.f32}, names=["y32"]).output]
    m = runtime.load(write_artifact(tmp_path / "m.dz", g, "reference"))
    x = torch.randn(4, 3).bfloat16()
    expected = x * g.weight_data["w"]
    y_bf16, y_f32 = m(x)
    assert y_bf16.dtype.name == "bfloat16" and y_f32.dtype == np.float32
    np.testing.assert_array_equal(y_f32, expected.float().numpy())
    again = m(y_bf16 / np.asarray(2, y_bf16.dtype))  # ml_dtypes bf16 arrays are accepted too
    np.testing.assert_array_equal(again[1], (expected / 2 * g.weight_data["w"]).float().numpy())


def test_missing_backend_is_named(tmp_path, make_mlp):
    out = write_artifact(tmp_path / "m.dz", make_mlp(), "reference")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["backend"] = "quantum"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DayzeroError, match="compiled for backend 'quantum', which cannot be "
                                           "used here: unknown backend 'quantum'; available: "
                                           ".*reference"):
        runtime.load(out)


def test_verify_size_mode_loads(tmp_path, make_mlp):
    g = make_mlp()
    m = runtime.load(write_artifact(tmp_path / "m.dz", g, "reference"), verify="size")
    assert m(np.zeros((2, 4), np.float32))[0].shape == (2, 3)
    with pytest.raises(ValueError, match="verify must be one of"):
        runtime.load(tmp_path / "m.dz", verify="none")


@pytest.mark.parametrize("returned", [(0, 3), (5, 4), (5,), (5, 3, 1)])
def test_an_output_of_the_wrong_shape_is_never_returned(mlp, returned):
    """A lowering bug that returns the wrong shape (an empty (1, 0, 4) for f32[1, s0, 4] once)
    is an error at the call, whatever the backend."""
    _, m = mlp
    m._executable = lambda arrays: [np.zeros(returned, np.float32)]
    with pytest.raises(OutputShapeError) as info:
        m(np.ones((5, 4), np.float32))
    assert f"output 'y' of shape {list(returned)}" in str(info.value)
    assert "f32[s0, 3] is [5, 3] for these inputs (s0 = 5)" in str(info.value)


def test_outputs_of_the_right_shape_pass_the_check(mlp):
    _, m = mlp
    m._executable = lambda arrays: [np.zeros((arrays[0].shape[0], 3), np.float32)]
    assert m(np.ones((7, 4), np.float32))[0].shape == (7, 3)


@pytest.fixture(params=["reference", "onnxruntime"])
def adder(tmp_path, request):
    """z = x + y, both f32[s0, 4], on the reference backend and on onnxruntime."""
    g = Graph()
    g.symbols["s0"] = (2, 64)
    x = g.add_input("x", TensorType(DType.f32, (symbol("s0"), 4)))
    y = g.add_input("y", TensorType(DType.f32, (symbol("s0"), 4)))
    g.outputs = [g.add_node("add", [x, y], names=["z"]).output]
    return runtime.load(write_artifact(tmp_path / "add.dz", g, request.param))


def test_fixed_inputs_are_validated_once_and_bind_their_symbols(adder):
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    bound = adder.with_fixed_inputs({"y": y})
    assert [s.name for s in bound.free_specs] == ["x"]
    x = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(bound(x=x)[0], adder(x, y)[0])
    for _ in range(2):
        y += 1  # changed in place between calls, as a KV-cache pool is
        np.testing.assert_array_equal(bound(x=x)[0], x + y)
    y[1, 2] = np.nan
    assert np.isnan(bound(x=x)[0][1, 2])
    longer = np.ones((5, 4), np.float32)  # outputs follow each call's sizes
    np.testing.assert_array_equal(adder.with_fixed_inputs({"y": longer + 1})(x=longer)[0],
                                  longer * 2 + 1)
    with pytest.raises(InputError, match=r"input 'x' dim 0 is 5 but s0 is 3 \(from the fixed"):
        bound(x=np.ones((5, 4), np.float32))
    with pytest.raises(InputError, match=r"missing input\(s\) \['x'\]"):
        bound()
    with pytest.raises(InputError, match="has dtype f64"):
        adder.with_fixed_inputs({"y": y.astype(np.float64)})
    with pytest.raises(InputError, match=r"no input\(s\) w"):
        adder.with_fixed_inputs({"w": y})
