"""The onnxruntime backend as a whole: artifact layout, external weights, symbolic sizes,
session options, inspection, contrib-op fallback, corruption, and running without torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import pytest
import torch

import runtime
from backends import WeightLocation
from backends.base import WEIGHT_LAYOUTS
from backends.onnxruntime import (
    OnnxRuntimeBackend,
    format_node_map,
    native_ops,
    node_map,
    read_record,
)
from backends.onnxruntime.fused import VARIANTS, ContribFallbackWarning, choose
from backends.onnxruntime.lower import lower_graph
from backends.onnxruntime.probe import KernelSet, installed_kernels
from backends.reference.interpreter import run_graph
from compiler.errors import ArtifactError, DayzeroError
from compiler.ir import DType, Graph, TensorType, symbol
from runtime.artifact import Artifact
from runtime.safetensors_io import read_header
from tests.backends.onnxruntime_util import check_onnx, compile_graph, load

S = symbol("s0")


def block_graph(seed: int = 0) -> Graph:
    """An encoder block over x: f32[1, s0, 32]: rms_norm, q/k/v, attention, gelu MLP. The
    attention is not causal: MultiHeadAttention is picked only for attention without is_causal
    (see convert_attention.CAUSAL_MHA)."""
    gen = torch.Generator().manual_seed(seed)
    g = Graph()
    g.symbols["s0"] = (2, 256)
    f32 = lambda *shape: TensorType(DType.f32, shape)
    x = g.add_input("x", f32(1, S, 32))
    w = lambda name, *shape: g.add_weight(name, f32(*shape), torch.randn(*shape, generator=gen) / 4)
    node = lambda op, ins, **attrs: g.add_node(op, ins, attrs).output
    h = node("rms_norm", [x, w("norm", 32)], normalized_shape=[32])
    heads = []
    for name in ("q", "k", "v"):
        p = node("linear", [h, w(f"{name}_proj", 32, 32), None])
        heads.append(node("permute", [node("reshape", [p], shape=[1, S, 4, 8])], dims=[0, 2, 1, 3]))
    a = node("scaled_dot_product_attention", [*heads, None], is_causal=False)
    a = node("reshape", [node("permute", [a], dims=[0, 2, 1, 3])], shape=[1, S, 32])
    x = node("add", [x, a])
    m = node("gelu", [node("linear", [x, w("up", 64, 32), w("up_b", 64)])])
    g.outputs = [node("add", [x, node("linear", [m, w("down", 32, 64), None])])]
    return g


def fake_locations(g: Graph) -> dict[str, WeightLocation]:
    """Locations for lowering without writing an artifact (the model is never run)."""
    return {name: WeightLocation("weights/w.safetensors", 0, 4 * v.type.rank, "f32",
                                 tuple(v.type.shape)) for name, v in g.weights.items()}


@pytest.fixture(scope="module")
def block_artifact(tmp_path_factory):
    g = block_graph()
    return g, compile_graph(g, tmp_path_factory.mktemp("art") / "block.dz")


def test_matches_reference_at_several_sizes_with_one_session(block_artifact):
    g, path = block_artifact
    exe = load(path)
    for size in (2, 3, 64, 256):
        x = np.random.default_rng(size).standard_normal((1, size, 32)).astype(np.float32)
        (got,) = exe([x])
        (want,) = run_graph(g, g.weight_data, [x])
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_symbolic_dims_are_named_onnx_dims(block_artifact):
    _, path = block_artifact
    model = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False)
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    assert dims(model.graph.input[0]) == [1, "s0", 32]
    assert dims(model.graph.output[0]) == [1, "s0", 32]
    check_onnx(path)


def test_weights_are_external_data_inside_the_safetensors_files(block_artifact):
    g, path = block_artifact
    onnx_path = path / "backend" / "model.onnx"
    model = onnx.load(str(onnx_path), load_external_data=False)
    # a weight only a native kernel reads is stored in that kernel's layout instead
    derived = json.loads((path / "manifest.json").read_text()).get("derived_weights", {})
    weights = {t.name: t for t in model.graph.initializer
               if t.name in g.weights or t.name in derived}
    assert {derived[n]["source"] if n in derived else n for n in weights} == set(g.weights)
    headers = {}
    for name, tensor in weights.items():
        assert tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.raw_data
        info = {e.key: e.value for e in tensor.external_data}
        assert info["location"].startswith("weights/") and info["location"].endswith(".safetensors")
        entry = headers.setdefault(info["location"], read_header(path / info["location"], ""))[name]
        assert (int(info["offset"]), int(info["length"])) == (entry.begin, entry.nbytes)
        raw = (path / info["location"]).read_bytes()[entry.begin:entry.end]
        want = g.weight_data[derived[name]["source"] if name in derived else name].numpy()
        if name in derived:
            want = WEIGHT_LAYOUTS[derived[name]["layout"]].forward(want)
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(entry.shape), want)
    # the model file holds the graph only: far smaller than the weights it refers to
    weight_bytes = sum(t.numel() * 4 for t in g.weight_data.values())
    assert onnx_path.stat().st_size < weight_bytes / 4
    payload = sorted(p.name for p in (path / "backend").iterdir())
    # the portable model (graph only, the same weights) where the native linear kernel is used
    portable = ["model.portable.onnx"] if native_ops.library() is not None else []
    assert payload == ["lowering.json", "model.onnx", *portable]


def test_no_second_copy_of_the_weights_anywhere_in_the_artifact(tmp_path):
    """A 4 MB weight: the artifact is one safetensors copy plus a few kilobytes."""
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 1024)))
    w = g.add_weight("w", TensorType(DType.f32, (1024, 1024)), torch.randn(1024, 1024))
    g.outputs = [g.add_node("linear", [x, w, None]).output]
    path = compile_graph(g, tmp_path / "big.dz")
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert 4 * 2**20 <= total < 4 * 2**20 + 64 * 1024
    x = np.ones((2, 1024), np.float32)
    want = x.astype(np.float64) @ g.weight_data["w"].numpy().astype(np.float64).T
    np.testing.assert_allclose(load(path)([x])[0], want, rtol=1e-4, atol=1e-3)  # 1024-term sums


def test_session_options_are_recorded_and_applied(tmp_path):
    g = block_graph()
    options = {"session": {"intra_op_threads": 1, "graph_optimization_level": "basic"}}
    path = compile_graph(g, tmp_path / "m.dz", options)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["backend_options"] == options
    assert "backend/lowering.json" in manifest["files"]
    record = read_record(Artifact(path))
    assert record["session"]["intra_op_threads"] == 1
    assert record["session"]["graph_optimization_level"] == "basic"
    assert record["session"]["inter_op_threads"] == 1
    session = load(path).session
    assert session.get_session_options().intra_op_num_threads == 1


@pytest.mark.parametrize("options,key", [({"bogus": 1}, "bogus"),
                                         ({"session": {"threads": 2}}, "threads"),
                                         ({"session": {"graph_optimization_level": "max"}},
                                          "graph_optimization_level")])
def test_bad_options_name_the_key(tmp_path, options, key):
    with pytest.raises(DayzeroError, match=key):
        compile_graph(block_graph(), tmp_path / "m.dz", options)
    assert not (tmp_path / "m.dz").exists()


def test_inspect_maps_every_ir_node_to_its_onnx_ops(block_artifact):
    g, path = block_artifact
    entries = node_map(Artifact(path))
    assert len(entries) == len(g.nodes)
    by_op = {}
    for node, entry in zip(g.nodes, entries):
        assert entry["node"].split(" = ")[1].startswith(node.op)
        by_op.setdefault(node.op, entry)
    # no reshapes around the product: the artifact stores the native kernel's panels (or
    # the weight as it is, for ORT's FusedMatMul)
    assert by_op["linear"]["onnx"] == (
        ["ai.dayzero.PackedLinear"] if native_ops.library() is not None
        else ["com.microsoft.FusedMatMul"])
    assert by_op["permute"]["onnx"] == ["Transpose"]
    assert "Sqrt" in by_op["rms_norm"]["onnx"]
    assert by_op["scaled_dot_product_attention"]["lowering"] == "com.microsoft.MultiHeadAttention"
    assert "com.microsoft.MultiHeadAttention" in by_op["scaled_dot_product_attention"]["onnx"]
    assert by_op["gelu"]["onnx"] == ["com.microsoft.Gelu"]
    text = format_node_map(read_record(Artifact(path)))
    assert "@q_proj" in text and "-> Transpose" in text
    assert "com.microsoft.MultiHeadAttention x1" in text and "com.microsoft.Gelu x1" in text


def test_rms_norm_becomes_ort_fused_kernel_at_load(block_artifact, tmp_path):
    """The standard-op rms_norm is fused by ORT into SimplifiedLayerNormalization."""
    import onnxruntime as ort

    from backends.onnxruntime.session import SessionConfig, session_options

    _, path = block_artifact
    so = session_options(SessionConfig(), path)
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession((path / "backend" / "model.onnx").read_bytes(), so,
                         providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    assert "SimplifiedLayerNormalization" in {n.op_type for n in optimized.graph.node}


def test_missing_contrib_op_falls_back_with_a_warning_naming_it():
    g = block_graph()
    kernels = installed_kernels().without(["com.microsoft.Gelu"])
    node = next(n for n in g.nodes if n.op == "gelu")
    with pytest.warns(ContribFallbackWarning, match="com.microsoft.Gelu"):
        assert choose(node, kernels) is None
    assert choose(node, installed_kernels()).name == "com.microsoft.Gelu"
    with pytest.warns(ContribFallbackWarning, match="com.microsoft.Gelu"):
        lowered = lower_graph(g, fake_locations(g), kernels)
    assert "com.microsoft.Gelu" not in lowered.variants()
    assert "com.microsoft.MultiHeadAttention" in lowered.variants()


def test_build_without_contrib_ops_runs_standard_onnx(tmp_path):
    """An ORT build with no com.microsoft kernels (simulated) gets a standard-ops model."""
    g = block_graph()
    excluded = sorted({str(k) for variants in VARIANTS.values() for v in variants
                       for k in v.requires})
    with pytest.warns(ContribFallbackWarning) as caught:
        path = compile_graph(g, tmp_path / "m.dz", {"exclude_kernels": excluded})
    named = " ".join(str(w.message) for w in caught)
    for op in ("com.microsoft.Gelu", "com.microsoft.MultiHeadAttention",
               "com.microsoft.FusedMatMul"):
        assert op in named
    model = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False)
    assert {n.domain for n in model.graph.node} == {""}
    assert [o.domain for o in model.opset_import] == [""]
    check_onnx(path)
    x = np.random.default_rng(0).standard_normal((1, 9, 32)).astype(np.float32)
    np.testing.assert_allclose(load(path)([x])[0], run_graph(g, g.weight_data, [x])[0].numpy(),
                               rtol=1e-5, atol=1e-5)


def test_empty_kernel_set_never_emits_contrib_ops():
    g = block_graph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContribFallbackWarning)
        lowered = lower_graph(g, fake_locations(g), KernelSet(()))
    assert lowered.variants() == {}
    assert all(not n.domain for n in lowered.model.graph.node)


def test_corrupted_model_onnx_is_refused_before_onnxruntime_sees_it(block_artifact, tmp_path,
                                                                    monkeypatch):
    import shutil

    import backends.onnxruntime.session as session

    _, path = block_artifact
    copy = shutil.copytree(path, tmp_path / "copy.dz")
    model = copy / "backend" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    monkeypatch.setattr(session, "create_session",
                        lambda *a, **k: pytest.fail("ORT was given a corrupted model"))
    with pytest.raises(ArtifactError, match="backend/model.onnx"):
        runtime.load(copy)


def test_unsupported_node_is_reported_by_supports_and_lower(tmp_path):
    g = Graph()
    g.symbols["s0"] = (1, 8)
    x = g.add_input("x", TensorType(DType.f32, (1, 3, S, 5)))
    node = g.add_node("adaptive_avg_pool", [x], {"output_size": [2, 2]})
    g.outputs = [node.output]
    assert not OnnxRuntimeBackend().supports(node)
    with pytest.raises(DayzeroError, match="static input sizes"):
        lower_graph(g, fake_locations(g))


BLOCK_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked in this test ({name})")
            return None

    sys.meta_path.insert(0, NoTorch())
""")


def test_runs_without_torch_or_onnx(block_artifact, tmp_path):
    """runtime.load + run in a process where importing torch fails; onnx is never imported."""
    g, path = block_artifact
    x = np.random.default_rng(5).standard_normal((1, 11, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = BLOCK_TORCH + textwrap.dedent(f"""
        import numpy as np, runtime
        m = runtime.load({str(path)!r})
        (y,) = m(np.load({str(tmp_path / "x.npy")!r}))
        np.save({str(tmp_path / "y.npy")!r}, y)
        bad = sorted(k for k in sys.modules if k.split(".")[0] in ("torch", "onnx", "passes")
                     or k.startswith("compiler.frontend"))
        assert not bad, bad
        print(m.backend.name)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "onnxruntime"
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                               run_graph(g, g.weight_data, [x])[0].numpy(), rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_outputs_and_weights(tmp_path):
    """bf16 crosses the session boundary as float32 (exactly) and computes in float32."""
    import ml_dtypes

    g = Graph()
    g.symbols["s0"] = (1, 8)
    x = g.add_input("x", TensorType(DType.bf16, (S, 4)))
    w = g.add_weight("w", TensorType(DType.bf16, (3, 4)), torch.randn(3, 4, dtype=torch.bfloat16))
    y = g.add_node("linear", [x, w, None]).output
    g.outputs = [g.add_node("gelu", [y]).output, y]
    path = compile_graph(g, tmp_path / "bf16.dz")
    check_onnx(path)
    model = runtime.load(path)
    data = np.random.default_rng(0).standard_normal((5, 4)).astype(ml_dtypes.bfloat16)
    got = model(data)
    as_torch = torch.from_numpy(data.view(np.uint16)).view(torch.bfloat16)
    want = run_graph(g, g.weight_data, [as_torch])
    for g_, w_ in zip(got, want):
        assert g_.dtype == ml_dtypes.bfloat16 and g_.shape == tuple(w_.shape)
        np.testing.assert_allclose(g_.astype(np.float32), w_.float().numpy(), rtol=1e-2, atol=1e-2)


def test_loading_on_a_build_without_the_contrib_kernels_says_how_to_recompile(block_artifact,
                                                                              monkeypatch):
    import backends.onnxruntime.probe as probe

    _, path = block_artifact
    reduced = installed_kernels().without(["com.microsoft.MultiHeadAttention"])
    monkeypatch.setattr(probe, "installed_kernels", lambda: reduced)
    with pytest.raises(DayzeroError, match="MultiHeadAttention") as err:
        runtime.load(path)
    assert "exclude_kernels" in err.value.fix


def test_outputs_that_are_inputs_weights_constants_or_repeated(tmp_path):
    g = Graph()
    g.symbols["s0"] = (1, 8)
    x = g.add_input("x", TensorType(DType.f32, (S, 2)))
    w = g.add_weight("w", TensorType(DType.f32, (2,)), torch.tensor([1.5, -2.0]))
    c = g.add_node("constant", [], {"value": 3, "dtype": DType.i64}).output
    y = g.add_node("mul", [x, w]).output
    g.outputs = [x, y, y, w, c]
    path = compile_graph(g, tmp_path / "m.dz")
    check_onnx(path)
    data = np.arange(6, dtype=np.float32).reshape(3, 2)
    got = runtime.load(path)(data)
    want = [data, data * [1.5, -2.0], data * [1.5, -2.0], np.array([1.5, -2.0]), np.array(3)]
    assert len(got) == 5
    for g_, w_ in zip(got, want):
        np.testing.assert_array_equal(g_, w_)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["inputs"][0].update(dtype="i64"),
     "takes input 'x' as tensor(float), but its spec is i64 (tensor(int64))"),
    (lambda m: m["inputs"][0].update(shape=["s0", 4, 1]),
     "gives input 'x' the shape ['s0', 4], but its spec is ['s0', 4, 1]"),
    (lambda m: m["outputs"][0].update(shape=["s0", 5]),
     "gives output 'y' the shape ['s0', 3], but its spec is ['s0', 5]"),
    (lambda m: m["outputs"].append(dict(m["outputs"][0], name="z")),
     "has 1 outputs (y), but manifest.json lists 2"),
])
def test_specs_that_disagree_with_the_model_are_refused_at_load(tmp_path, edit, message):
    """manifest.json is not hashed (it holds the hashes): an edited spec must not make the model
    answer with tensors its specs do not describe."""
    from compiler.writer import write_artifact
    from tests.runtime.conftest import mlp_graph

    out = write_artifact(tmp_path / "m.dz", mlp_graph(), "onnxruntime")
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError) as info:
        runtime.load(out)
    assert message in info.value.what
