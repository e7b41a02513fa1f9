"""ai.dayzero.MatMulInt4 (native/int4_op.cc), run as one-node ONNX models against a float64
NumPy reference of quantized_linear's decomposition (int8-rounded rows, int4 weights); its
layout, NaN and Inf rows, error messages; that the lowering picks it for int4 weights with
int8 activations and still matches the reference backend; and that the artifact stores the codes
and scales in its tile layout (mapped at load, one copy: peak memory grows by their bytes), the
portable model reading them back with a warning."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import compiler
import runtime
from backends.onnxruntime import native_ops
from backends.onnxruntime.convert_int4 import tile_layout
from backends.onnxruntime.session import SessionConfig, session_options
from tests.backends.onnxruntime_util import run_x as run

pytestmark = pytest.mark.skipif(native_ops.library() is None, reason="native library not built")


def quantized(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """quantized_linear's tensors: codes u8 [n, k / 32, 16], scales f16 [n * k / 32] (one in
    float16's subnormal range, which the kernel must read exactly too)."""
    codes = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
    scales = ((rng.random(n * k // 32, dtype=np.float32) + 0.05) * 0.02).astype(np.float16)
    scales[min(3, scales.size - 1)] = np.float16(3e-6)
    return codes, scales


packed = tile_layout  # the kernel's layout (int4_matmul.h), as the lowering makes it


def reference(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, bias=None) -> np.ndarray:
    """quantized_linear's decomposition with activations int8, the rounding in float32 as the
    IR does it, the product in float64."""
    n, blocks, _ = codes.shape
    k = blocks * 32
    rows = x.reshape(-1, blocks, 32).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s = np.abs(rows).max(-1, keepdims=True) / np.float32(127)
        s = np.where(np.isnan(np.abs(rows)).any(-1, keepdims=True), np.float32(np.nan), s)
        inverse = np.where(s > 0, np.float32(1) / s, np.float32(0)).astype(np.float32)
        xr = (np.round(rows * inverse) * s).reshape(-1, k).astype(np.float64)
    pairs = np.stack([codes & 15, codes >> 4], -1).reshape(n, blocks, 32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf propagate, as in torch
        weight = ((pairs - 8) * scales.astype(np.float64).reshape(n, blocks, 1)).reshape(n, k)
        y = xr @ weight.T
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], n)


def one_node(codes, scales, bias=None, rank: int = 2):
    inits = [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scales, "scales")]
    names = ["x", "codes", "scales"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "bias"))
        names.append("bias")
    node = helper.make_node("MatMulInt4", names, ["y"], domain=native_ops.DOMAIN)
    graph = helper.make_graph(
        [node], "int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None] * rank)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid(native_ops.DOMAIN, 1)])


CASES = [  # leading dims of x, in_features, out_features, bias
    ((1,), 1024, 1536, False),     # a decode step's merged QKV
    ((1, 1, 1), 128, 40, True),    # rank 3, one row
    ((3,), 64, 8, True),           # one pair of blocks, one tile
    ((2, 17), 192, 24, False),     # 34 rows: two row tiles
    ((130,), 256, 136, True),      # several tasks of tiles, many rows
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("lead, k, n, with_bias", CASES)
def test_matches_the_decomposition(lead, k, n, with_bias, threads):
    rng = np.random.default_rng(k + n)
    codes, scales = quantized(rng, n, k)
    bias = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    x = rng.standard_normal((*lead, k), dtype=np.float32) * 2
    x[..., :32] = 0.0  # an all-zero block rounds to zeros
    got = run(one_node(*packed(codes, scales), bias, rank=len(lead) + 1), x, threads)
    want = reference(x, codes, scales, bias)
    assert got.shape == (*lead, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_rounding_ties_go_to_even():
    """x / s lands exactly on .5 for these inputs: round half to even, as torch.round does, so
    the kernel's codes are the decomposition's."""
    rng = np.random.default_rng(5)
    codes, scales = quantized(rng, 8, 64)
    x = np.zeros((1, 64), np.float32)
    x[0, :32] = np.float32(127) * np.array([1, 0.5, 1.5, 2.5, -0.5, -2.5] * 5 + [3.5, 0.0]) / 127
    x[0, 0] = 127.0  # s = 1, so x / s is x itself
    got = run(one_node(*packed(codes, scales)), x)
    np.testing.assert_allclose(got, reference(x, codes, scales), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_row_with_nan_or_inf_is_nan_everywhere(bad):
    """The decomposition's block scale becomes NaN or Inf, and 0 * Inf is NaN: the whole row is
    NaN, whatever the weights; the other rows are untouched."""
    rng = np.random.default_rng(7)
    codes, scales = quantized(rng, 16, 128)
    x = rng.standard_normal((3, 128), dtype=np.float32)
    x[1, 77] = bad
    got = run(one_node(*packed(codes, scales)), x)
    want = reference(x, codes, scales)
    assert np.isnan(want[1]).all() and np.isnan(got[1]).all()
    np.testing.assert_allclose(got[[0, 2]], want[[0, 2]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("codes_shape, scales_shape, x_shape, message", [
    ((2, 2, 8, 32), (2, 4, 8), (1, 64), "codes hold 128 in_features; x has 64"),
    ((2, 1, 8, 16), (2, 2, 8), (1, 64), r"codes must be \[out_features / 8"),
    ((2, 1, 8, 32), (2, 1, 8), (1, 64), r"scales must be \[out_features / 8, in_features / 32"),
])
def test_bad_shapes_are_named(codes_shape, scales_shape, x_shape, message):
    model = one_node(np.zeros(codes_shape, np.uint8), np.ones(scales_shape, np.float16))
    with pytest.raises(Exception, match=message):
        run(model, np.ones(x_shape, np.float32))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(128, 192), nn.Linear(192, 64, bias=False)
        self.odd = nn.Linear(64, 36)  # 36 outputs: not a multiple of 8, so MatMulNBits

    def forward(self, x):
        return self.odd(self.down(torch.relu(self.up(x))))


def test_the_lowering_uses_it_and_matches_the_reference_backend(tmp_path):
    config = {"quantize": {"weights": "int4", "group_size": 32, "activations": "int8"}}
    x = torch.randn(5, 128)
    built = {b: compiler.compile(Mlp().eval(), (x,), out=tmp_path / f"{b}.dz", backend=b,
                                 config=config) for b in ("onnxruntime", "reference")}
    graph = onnx.load(str(built["onnxruntime"] / "backend" / "model.onnx"),
                      load_external_data=False).graph
    assert [n.op_type for n in graph.node if n.op_type in ("MatMulInt4", "MatMulNBits")] == \
        ["MatMulInt4", "MatMulInt4", "MatMulNBits"]
    portable = onnx.load(str(built["onnxruntime"] / "backend" / "model.portable.onnx"),
                         load_external_data=False).graph
    assert not [n for n in portable.node if n.op_type == "MatMulInt4"]
    feed = np.random.default_rng(2).standard_normal((5, 128)).astype(np.float32)
    got = runtime.load(built["onnxruntime"])(feed)[0]
    want = runtime.load(built["reference"])(feed)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("vectorized", [0, 1])
def test_both_paths_of_the_kernel(vectorized):
    """The portable path (ONNX Runtime reaches it on CPUs without AVX2) and the AVX2 one, called
    directly on one thread through the library's test entry point."""
    import ctypes

    lib = ctypes.CDLL(str(native_ops.library()))
    lib.DayzeroInt4MatMul.restype = ctypes.c_int
    rng = np.random.default_rng(11)
    rows, k, n = 5, 192, 24
    codes, scales = quantized(rng, n, k)
    bias = rng.standard_normal(n, dtype=np.float32)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    x[3, 5] = np.nan
    tiles, tile_scales = packed(codes, scales)
    y = np.zeros((rows, n), np.float32)
    ptr = ctypes.c_void_p
    status = lib.DayzeroInt4MatMul(
        ctypes.c_int64(rows), ctypes.c_int64(k), ctypes.c_int64(n), ptr(x.ctypes.data),
        ptr(tiles.ctypes.data), ptr(tile_scales.ctypes.data), ptr(bias.ctypes.data),
        ptr(y.ctypes.data), ctypes.c_int(vectorized))
    assert status == 0
    want = reference(x, codes, scales, bias)
    assert np.isnan(y[3]).all()
    np.testing.assert_allclose(np.delete(y, 3, 0), np.delete(want, 3, 0), rtol=1e-5, atol=1e-5)
    assert lib.DayzeroInt4MatMul(ctypes.c_int64(rows), ctypes.c_int64(100), ctypes.c_int64(n),
                                 None, None, None, None, None, ctypes.c_int(vectorized)) == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nonfinite_weight_scale_makes_its_column_nan(bad):
    """The quantizer makes an infinite scale from an infinite weight, and the block's finite
    weights then round to the zero point 8: (8 - 8) * Inf is NaN in the decomposition."""
    rng = np.random.default_rng(13)
    codes, scales = quantized(rng, 16, 128)
    codes[5, 2, 3] = 0x88  # two codes of the zero point in that block
    scales[5 * 4 + 2] = np.float16(bad)
    x = rng.standard_normal((2, 128), dtype=np.float32)
    got = run(one_node(*packed(codes, scales)), x)
    want = reference(x, codes, scales)
    assert np.isnan(want[:, 5]).all() and np.isnan(got[:, 5]).all()
    np.testing.assert_allclose(np.delete(got, 5, 1), np.delete(want, 5, 1), rtol=1e-5, atol=1e-5)


INT4 = {"quantize": {"weights": "int4", "group_size": 32, "activations": "int8"}}
TILED = {"up.weight": 192, "down.weight": 64}  # MatMulInt4's weights -> out_features


def _stored(path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    stored = {}
    for file in (path / "weights").glob("*.safetensors"):
        stored.update(load_file(str(file)))
    return stored


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The int4 Mlp compiled for onnxruntime (tiles stored) and for the reference backend
    (MatMulNBits' tensors stored as the graph has them), and an input."""
    out = tmp_path_factory.mktemp("int4")
    x = torch.randn(5, 128)
    paths = {b: compiler.compile(Mlp().eval(), (x,), out=out / f"{b}.dz", backend=b,
                                 config=INT4) for b in ("onnxruntime", "reference")}
    return paths, np.random.default_rng(2).standard_normal((5, 128)).astype(np.float32)


def test_the_artifact_stores_the_tiles_the_kernel_reads(built):
    """The writer stores `tile_layout` of the codes and scales only MatMulInt4 reads, instead of
    them: the kernel's initializers are those bytes (external data), with no Reshape or
    Transpose on them, and the manifest says which tensor each is, in which layout (the scales'
    with its parameter, the output columns)."""
    paths, _ = built
    stored, graph_weights = _stored(paths["onnxruntime"]), _stored(paths["reference"])
    expected = {}
    for name, n in TILED.items():
        codes, scales = graph_weights[f"{name}.q4"], graph_weights[f"{name}.scales"]
        assert f"{name}.q4" not in stored and f"{name}.scales" not in stored
        tiles, tile_scales = tile_layout(codes, scales)
        np.testing.assert_array_equal(stored[f"{name}.q4.int4_tiles8"], tiles)
        np.testing.assert_array_equal(stored[f"{name}.scales.scale_tiles8"], tile_scales)
        assert stored[f"{name}.scales.scale_tiles8"].dtype == np.float16
        expected[f"{name}.q4.int4_tiles8"] = {"source": f"{name}.q4", "layout": "int4_tiles8"}
        expected[f"{name}.scales.scale_tiles8"] = {
            "source": f"{name}.scales", "layout": "scale_tiles8", "params": {"rows": n}}
    for name in ("odd.weight.q4", "odd.weight.scales"):  # MatMulNBits reads them as they are
        np.testing.assert_array_equal(stored[name], graph_weights[name])
    manifest = json.loads((paths["onnxruntime"] / "manifest.json").read_text())
    assert manifest["derived_weights"] == expected
    graph = onnx.load(str(paths["onnxruntime"] / "backend" / "model.onnx"),
                      load_external_data=False).graph
    kernels = [n for n in graph.node if n.op_type == "MatMulInt4"]
    assert [list(n.input[1:3]) for n in kernels] == [
        [f"{name}.q4.int4_tiles8", f"{name}.scales.scale_tiles8"] for name in TILED]
    assert not [n for n in graph.node if n.op_type in ("Transpose", "Reshape")
                and set(n.input) & set(expected)]
    external = {t.name for t in graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL}
    assert set(expected) <= external


def test_the_optimized_session_reads_the_stored_tiles(built, tmp_path):
    """ORT's optimized model runs no Reshape or Transpose and keeps MatMulInt4's
    initializers external: the stored tiles are mapped, not folded into copies."""
    path = built[0]["onnxruntime"]
    options = session_options(SessionConfig(), external_folder=path)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession((path / "backend" / "model.onnx").read_bytes(), options,
                         providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    assert not [n for n in optimized.graph.node if n.op_type in ("Transpose", "Reshape")]
    inline = {t.name for t in optimized.graph.initializer
              if t.data_location != onnx.TensorProto.EXTERNAL}
    kernels = [n for n in optimized.graph.node if n.op_type == "MatMulInt4"]
    assert len(kernels) == 2 and not {i for n in kernels for i in n.input[1:3]} & inline


def test_outputs_are_bit_equal_to_the_folded_layout(built, tmp_path, monkeypatch):
    """The stored tiles are the bytes ORT folded from MatMulNBits' layout before: the same
    kernel on them gives the same bits (the artifact compiled without derived weights still
    folds, as it did)."""
    import backends.onnxruntime as ortb

    paths, feed = built
    assert "up.weight.q4.int4_tiles8" in json.loads(
        (paths["onnxruntime"] / "manifest.json").read_text())["derived_weights"]
    monkeypatch.setattr(ortb.OnnxRuntimeBackend, "derived_weights", lambda *a: {})
    folded = compiler.compile(Mlp().eval(), (torch.randn(5, 128),), out=tmp_path / "f.dz",
                              backend="onnxruntime", config=INT4)
    graph = onnx.load(str(folded / "backend" / "model.onnx"), load_external_data=False).graph
    assert {n.op_type for n in graph.node} >= {"MatMulInt4", "Transpose", "Reshape"}
    assert "derived_weights" not in json.loads((folded / "manifest.json").read_text())
    np.testing.assert_array_equal(runtime.load(paths["onnxruntime"])(feed)[0],
                                  runtime.load(folded)(feed)[0])


def test_the_portable_model_reads_the_tiles_and_warns(built, monkeypatch):
    """Without MatMulInt4 the portable model (MatMulNBits) reads the codes and scales back
    from the stored tiles (folded at load: a copy, said in the warning), matching the
    reference backend as the kernel does."""
    import runtime.artifact
    from backends.onnxruntime import OnnxRuntimeBackend
    from backends.onnxruntime.probe import installed_kernels

    paths, feed = built
    portable = onnx.load(str(paths["onnxruntime"] / "backend" / "model.portable.onnx"),
                         load_external_data=False).graph
    reads = {i for n in portable.node for i in n.input}
    names = [f"{name}.{part}" for name in TILED for part in
             ("q4.int4_tiles8", "scales.scale_tiles8")]
    assert set(names) <= reads and "MatMulNBits" in {n.op_type for n in portable.node}
    kernels = installed_kernels()
    monkeypatch.setattr("backends.onnxruntime.probe.installed_kernels",
                        lambda: kernels.without(["ai.dayzero.MatMulInt4"]))
    with pytest.warns(native_ops.PortableFallbackWarning, match="copies the weights"):
        got = OnnxRuntimeBackend().load(runtime.artifact.Artifact(paths["onnxruntime"]))([feed])
    want = runtime.load(paths["reference"])(feed)[0]
    np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-4 * float(np.abs(want).max()))


def test_the_graph_layout_reads_back_exactly(built):
    """`with_sources` (dayzero align's reference run) undoes the stored layouts, the scales'
    with the parameter the manifest records: MatMulNBits' tensors, bit for bit."""
    from backends.base import with_sources

    paths, _ = built
    manifest = json.loads((paths["onnxruntime"] / "manifest.json").read_text())
    weights = with_sources(_stored(paths["onnxruntime"]), manifest["derived_weights"])
    for name, tensor in _stored(paths["reference"]).items():
        np.testing.assert_array_equal(weights[name], tensor)
        assert weights[name].dtype == tensor.dtype




LOAD_SCRIPT = r"""
import re, sys, numpy as np, runtime
def status(key):
    text = open("/proc/self/status").read()
    return int(re.search(key + r":\s+(\d+)", text).group(1)) * 1024
runtime.load(sys.argv[1])(np.ones((1, 64), np.float32))  # ORT's and the library's start-up
before = status("VmHWM")
model = runtime.load(sys.argv[2])
model(np.ones((1, 2048), np.float32))
print(status("VmHWM") - before)
"""


class Wide(nn.Module):
    def __init__(self, layers: int = 16, width: int = 2048):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_load_peaks_at_one_copy_of_the_int4_weights(tmp_path):
    """Loading and running the first call maps the stored tiles: the process's peak resident
    memory (VmHWM) grows by the int4 weights' bytes (36 MiB), not twice them as when ORT
    folded MatMulNBits' layout into a copy."""
    import subprocess
    import sys

    torch.manual_seed(3)
    path = compiler.compile(Wide().eval(), (torch.randn(1, 2048),), out=tmp_path / "w.dz",
                            backend="onnxruntime", config=INT4)
    small = compiler.compile(Wide(1, 64).eval(), (torch.randn(1, 64),), out=tmp_path / "s.dz",
                             backend="onnxruntime", config=INT4)
    stored = _stored(path)
    assert all(name.endswith(("int4_tiles8", "scale_tiles8")) for name in stored)
    weights = sum(t.nbytes for t in stored.values())
    assert weights == 16 * (2048 * 2048 // 2 + 2048 * 64 * 2)  # 36 MiB: codes and scales
    out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(small), str(path)],
                         capture_output=True, text=True, check=True, cwd=str(tmp_path))
    grown = int(out.stdout.split()[-1])
    assert weights * 0.9 < grown <= weights * 1.15, \
        f"peak grew {grown / 2**20:.1f} MiB for {weights / 2**20:.0f} MiB of int4 weights"
