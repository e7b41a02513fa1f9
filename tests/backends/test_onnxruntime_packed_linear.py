"""ai.dayzero.PackedLinear (native/packed_linear_op.cc), run as one-node ONNX models against a
float64 NumPy product; its layout, NaN and Inf, error messages; that every instruction-set path
gives the same bits and a row's result never depends on the rows beside it; and that the
lowering picks it for float32 linear layers and matches torch."""

from __future__ import annotations

import ctypes
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
import runtime.artifact
from backends.onnxruntime import native_ops
from backends.onnxruntime.convert_packed_linear import panel_layout
from backends.onnxruntime.session import SessionConfig, session_options
from tests.backends.onnxruntime_util import run_x as run

pytestmark = pytest.mark.skipif(native_ops.library() is None, reason="native library not built")


def one_node(weight: np.ndarray, bias=None, rank: int = 2):
    inits = [numpy_helper.from_array(panel_layout(weight), "panels")]
    names = ["x", "panels"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "bias"))
        names.append("bias")
    node = helper.make_node("PackedLinear", names, ["y"], domain=native_ops.DOMAIN)
    graph = helper.make_graph(
        [node], "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None] * rank)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid(native_ops.DOMAIN, 1)])


def reference(x, weight, bias=None) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        y = x.astype(np.float64) @ weight.astype(np.float64).T
    return y if bias is None else y + bias


CASES = [  # leading dims of x, in_features, out_features, bias
    ((1,), 1024, 1536, False),     # a decode step's merged QKV
    ((1, 1, 1), 128, 32, True),    # rank 4, one row, one panel
    ((7,), 67, 96, True),          # an odd in_features; 7 rows: one short tile
    ((2, 17), 192, 64, False),     # 34 rows: full tiles and a tail
    ((130,), 40, 160, True),       # several row chunks per panel
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("lead, k, n, with_bias", CASES)
def test_matches_the_product(lead, k, n, with_bias, threads):
    rng = np.random.default_rng(k + n)
    weight = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    x = rng.standard_normal((*lead, k), dtype=np.float32)
    got = run(one_node(weight, bias, rank=len(lead) + 1), x, threads)
    assert got.shape == (*lead, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference(x, weight, bias), rtol=1e-5, atol=1e-5)


def direct(x: np.ndarray, weight: np.ndarray, bias, isa: int) -> np.ndarray:
    """The kernel on the calling thread through the library's test entry point."""
    lib = ctypes.CDLL(str(native_ops.library()))
    rows, k = x.shape
    n = weight.shape[0]
    panels = panel_layout(weight)
    y = np.full((rows, n), -7.0, np.float32)
    ptr = ctypes.c_void_p
    status = lib.DayzeroPackedLinear(
        ctypes.c_int64(rows), ctypes.c_int64(k), ctypes.c_int64(n), ptr(x.ctypes.data),
        ptr(panels.ctypes.data), ptr(bias.ctypes.data) if bias is not None else None,
        ptr(y.ctypes.data), ctypes.c_int(isa))
    assert status == 0
    return y


def best_isa() -> int:
    return ctypes.CDLL(str(native_ops.library())).DayzeroPackedLinearIsa()


@pytest.mark.parametrize("rows", [1, 2, 19])  # AVX2 takes 1 or 2 rows over a whole panel
@pytest.mark.parametrize("with_bias", [False, True])
def test_every_path_gives_the_same_bits(with_bias, rows):
    """Portable, AVX2 and AVX-512 (those this CPU has) do the same fused multiply-adds in the
    same order: bit-identical results, NaN and Inf included."""
    rng = np.random.default_rng(5)
    k, n = 301, 96
    weight = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    x = rng.standard_normal((rows, k), dtype=np.float32)
    weight[40, 3] = -np.inf
    bad = [4, 9] if rows > 9 else []  # a NaN row and an Inf row where there are rows to spare
    if bad:
        x[4, 7], x[9, 0] = np.nan, np.inf
    results = [direct(x, weight, bias, isa) for isa in range(best_isa() + 1)]
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    if bad:
        assert np.isnan(results[0][4]).all()
    np.testing.assert_allclose(np.delete(results[0], bad, 0),
                               np.delete(reference(x, weight, bias), bad, 0),
                               rtol=1e-4, atol=1e-4)


def test_a_row_does_not_depend_on_its_neighbours():
    """The same row alone, first, in the middle of a tile, in a tile tail and past a row chunk
    gives the same bits: batching sequences never changes an answer."""
    rng = np.random.default_rng(9)
    k, n = 256, 64
    weight = rng.standard_normal((n, k), dtype=np.float32)
    row = rng.standard_normal((1, k), dtype=np.float32)
    alone = run(one_node(weight), row, threads=1)
    for rows, at in [(8, 0), (8, 5), (13, 12), (100, 50), (100, 99)]:
        x = rng.standard_normal((rows, k), dtype=np.float32)
        x[at] = row[0]
        np.testing.assert_array_equal(run(one_node(weight), x)[at], alone[0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_propagate_as_in_torch(bad):
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((64, 48), dtype=np.float32)
    weight[10, 5] = 0.0  # Inf * 0 is NaN in that column
    x = rng.standard_normal((3, 48), dtype=np.float32)
    x[1, 5] = bad
    got = run(one_node(weight), x)
    want = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(weight)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal(np.sign(got[np.isinf(got)]), np.sign(want[np.isinf(want)]))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("panels_shape, x_shape, message", [
    ((2, 16, 16), (3, 16), "panels must be"),
    ((2, 16, 32), (3, 24), "panels hold 16 in_features; x has 24"),
])
def test_bad_shapes_are_named(panels_shape, x_shape, message):
    inits = [numpy_helper.from_array(np.zeros(panels_shape, np.float32), "panels")]
    node = helper.make_node("PackedLinear", ["x", "panels"], ["y"], domain=native_ops.DOMAIN)
    graph = helper.make_graph(
        [node], "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(native_ops.DOMAIN, 1)])
    with pytest.raises(Exception, match=f"PackedLinear: {message}"):
        run(model, np.zeros(x_shape, np.float32))


def test_zero_rows_give_an_empty_output():
    weight = np.ones((32, 8), np.float32)
    assert run(one_node(weight, rank=3), np.zeros((0, 4, 8), np.float32)).shape == (0, 4, 32)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(128, 192), nn.Linear(192, 64, bias=False)
        self.odd = nn.Linear(64, 36)  # 36 outputs: not a multiple of 32, so FusedMatMul

    def forward(self, x):
        return self.odd(self.down(torch.relu(self.up(x))))


def test_the_lowering_uses_it_and_matches_torch(tmp_path):
    model, x = Mlp().eval(), torch.randn(2, 5, 128)
    path = compiler.compile(model, (x,), out=tmp_path / "m.dz", backend="onnxruntime")
    graph = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False).graph
    assert [n.op_type for n in graph.node if n.op_type in ("PackedLinear", "FusedMatMul")] == \
        ["PackedLinear", "PackedLinear", "FusedMatMul"]
    portable = onnx.load(str(path / "backend" / "model.portable.onnx"),
                         load_external_data=False).graph
    assert not [n for n in portable.node if n.op_type == "PackedLinear"]
    got = runtime.load(path)(x.numpy())[0]
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _stored(path):
    from safetensors.numpy import load_file

    stored = {}
    for file in (path / "weights").glob("*.safetensors"):
        stored.update(load_file(str(file)))
    return stored


def test_the_artifact_stores_the_panels_the_kernel_reads(tmp_path):
    """The writer stores `panel_layout` of each weight only PackedLinear reads, instead of the
    weight: the kernel's initializer is those bytes, with no Reshape or Transpose on it, and
    the manifest says which graph weight each stored tensor is in which layout."""
    model = Mlp().eval()
    path = compiler.compile(model, (torch.randn(2, 5, 128),), out=tmp_path / "m.dz",
                            backend="onnxruntime")
    stored = _stored(path)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    for name in ("up.weight", "down.weight"):
        assert name not in stored
        np.testing.assert_array_equal(stored[f"{name}.panels32"], panel_layout(state[name]))
    np.testing.assert_array_equal(stored["odd.weight"], state["odd.weight"])  # FusedMatMul's
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["derived_weights"] == {
        "down.weight.panels32": {"source": "down.weight", "layout": "panels32"},
        "up.weight.panels32": {"source": "up.weight", "layout": "panels32"}}
    graph = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False).graph
    kernels = [n for n in graph.node if n.op_type == "PackedLinear"]
    assert [n.input[1] for n in kernels] == ["up.weight.panels32", "down.weight.panels32"]
    assert not [n for n in graph.node if n.op_type in ("Transpose", "Reshape")
                and set(n.input) & {"up.weight.panels32", "down.weight.panels32"}]
    external = {t.name for t in graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL}
    assert {"up.weight.panels32", "down.weight.panels32"} <= external


def test_the_optimized_session_reads_the_stored_panels(tmp_path):
    """ORT's optimized model keeps the kernels' initializers external (mapped, not copied)."""
    path = compiler.compile(Mlp().eval(), (torch.randn(2, 5, 128),), out=tmp_path / "m.dz",
                            backend="onnxruntime")
    options = session_options(SessionConfig(), external_folder=path)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession((path / "backend" / "model.onnx").read_bytes(), options,
                         providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    assert not [n for n in optimized.graph.node if n.op_type in ("Transpose", "Reshape")]
    inline = {t.name for t in optimized.graph.initializer
              if t.data_location != onnx.TensorProto.EXTERNAL}
    kernels = [n for n in optimized.graph.node if n.op_type == "PackedLinear"]
    assert len(kernels) == 2 and not {n.input[1] for n in kernels} & inline


def test_the_portable_model_reads_the_panels_and_warns(tmp_path, monkeypatch):
    """Without the native library the portable model reads the weights back from the panels
    (folded at load: a copy, said in the warning) and gives the same outputs."""
    import backends.onnxruntime as ortb
    from backends.onnxruntime.probe import installed_kernels

    model, x = Mlp().eval(), torch.randn(2, 5, 128)
    path = compiler.compile(model, (x,), out=tmp_path / "m.dz", backend="onnxruntime")
    portable = onnx.load(str(path / "backend" / "model.portable.onnx"),
                         load_external_data=False).graph
    reads = {i for n in portable.node for i in n.input}
    assert {"up.weight.panels32", "down.weight.panels32"} <= reads
    kernels = installed_kernels()
    monkeypatch.setattr("backends.onnxruntime.probe.installed_kernels",
                        lambda: kernels.without(["ai.dayzero.PackedLinear"]))
    with pytest.warns(native_ops.PortableFallbackWarning, match="copies the weights"):
        got = ortb.OnnxRuntimeBackend().load(runtime.artifact.Artifact(path))([x.numpy()])[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)


class Tied(nn.Module):
    """An embedding whose table is also the output projection (tied lm_head)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Embedding(96, 64)
        self.mix = nn.Linear(64, 64)

    def forward(self, ids):
        return nn.functional.linear(self.mix(self.embed(ids)), self.embed.weight)


def test_a_tied_weight_is_stored_in_both_layouts(tmp_path):
    """The embedding reads the table as it is (a Gather touches only its rows of the mapped
    file), PackedLinear reads the panels: both stored, neither copied at load."""
    model, ids = Tied().eval(), torch.tensor([[1, 5, 95, 0]])
    path = compiler.compile(model, (ids,), out=tmp_path / "t.dz", backend="onnxruntime")
    stored = _stored(path)
    table = model.embed.weight.detach().numpy()
    np.testing.assert_array_equal(stored["embed.weight"], table)
    np.testing.assert_array_equal(stored["embed.weight.panels32"], panel_layout(table))
    graph = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False).graph
    assert not [n for n in graph.node if n.op_type in ("Transpose", "Reshape")]
    with torch.no_grad():
        want = model(ids).numpy()
    np.testing.assert_allclose(runtime.load(path)(ids.numpy())[0], want, rtol=1e-5, atol=1e-5)


LOAD_SCRIPT = r"""
import re, sys, numpy as np, runtime
def status(key):
    text = open("/proc/self/status").read()
    return int(re.search(key + r":\s+(\d+)", text).group(1)) * 1024
runtime.load(sys.argv[1])(np.ones((1, 2, 32), np.float32))  # ORT's own start-up, warmed
before = status("VmHWM")
model = runtime.load(sys.argv[2])
model(np.ones((1, 2, 1024), np.float32))
print(status("VmHWM") - before, status("RssAnon"))
"""


def test_a_load_peaks_at_one_copy_of_the_weights(tmp_path):
    """Loading and running the first call maps the stored panels: the process's peak resident
    memory (VmHWM) grows by the weights' bytes, not twice them as when ORT folded a copy."""
    import subprocess
    import sys

    class Wide(nn.Module):
        def __init__(self, layers=16, width=1024):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width, bias=False)
                                        for _ in range(layers))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    path = compiler.compile(Wide().eval(), (torch.randn(1, 2, 1024),), out=tmp_path / "w.dz",
                            backend="onnxruntime")
    small = compiler.compile(Wide(1, 32).eval(), (torch.randn(1, 2, 32),),
                             out=tmp_path / "s.dz", backend="onnxruntime")
    out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(small), str(path)],
                         capture_output=True, text=True, check=True, cwd=str(tmp_path))
    grown = int(out.stdout.split()[-2])
    weights = 16 * 1024 * 1024 * 4  # 64 MiB
    assert weights * 0.9 < grown < weights * 1.15, \
        f"peak grew {grown / 2**20:.0f} MiB for 64 MiB of weights"
