"""onnxruntime artifacts run wherever dayzero's runtime is installed: the portable model stored
next to a model using dayzero's native kernels, the plain-ORT model `exclude_kernels` produces,
and the external-data offsets checked against the safetensors headers at load."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import compiler
import runtime
from backends.onnxruntime.external_data import external_initializers
from backends.onnxruntime.fused import ContribFallbackWarning
from compiler.cli import main
from compiler.errors import ArtifactError
from tests.backends.test_onnxruntime import BLOCK_TORCH

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # examples/ is no package of the install

import examples.llama as llama  # noqa: E402

CAUSAL = "ai.dayzero.CausalAttention"
PACKED = "ai.dayzero.PackedLinear"
GQA = "com.microsoft.GroupQueryAttention"
EXCLUDE = {"onnxruntime": {"exclude_kernels": [CAUSAL, PACKED]}}


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A one-layer Llama with a dynamic sequence, compiled with and without the native kernel;
    the eager logits for an 11-token prompt."""
    tmp = tmp_path_factory.mktemp("portable")
    model, args, dynamic = llama._spec(llama.config(layers=1), seq=8)
    native = compiler.compile(model, args, out=tmp / "native.dz", backend="onnxruntime",
                              dynamic_shapes=dynamic)
    with pytest.warns(ContribFallbackWarning, match=f"{CAUSAL} is excluded"):
        plain = compiler.compile(model, args, out=tmp / "plain.dz", backend="onnxruntime",
                                 dynamic_shapes=dynamic, backend_options=EXCLUDE)
    ids = torch.randint(0, 256, (1, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).numpy()
    return native, plain, ids.numpy(), want


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))


def fix_hash(artifact: Path, rel: str) -> None:
    """Record `rel`'s current size and sha256 in the manifest, as a careless re-save would."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    data = (artifact / rel).read_bytes()
    manifest["files"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (artifact / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def test_the_native_artifact_stores_a_portable_model_covered_by_the_manifest(decoder):
    native, _, ids, want = decoder
    record = json.loads((native / "backend" / "lowering.json").read_text())
    assert CAUSAL in record["variants"]
    portable = record["portable"]
    assert portable["model"] == "model.portable.onnx"
    assert sorted(portable["replaces"]) == [CAUSAL, PACKED]
    assert GQA in portable["variants"] and "ai.dayzero" not in json.dumps(portable["nodes"])
    files = json.loads((native / "manifest.json").read_text())["files"]
    for rel in ("backend/model.onnx", "backend/model.portable.onnx"):
        data = (native / rel).read_bytes()
        assert files[rel]["sha256"] == hashlib.sha256(data).hexdigest()
    model = onnx.load(str(native / "backend" / "model.portable.onnx"), load_external_data=False)
    assert all(n.domain != "ai.dayzero" for n in model.graph.node)
    weights = {t.name: {e.key: e.value for e in t.external_data}["location"]
               for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert weights and all(loc.startswith("weights/") for loc in weights.values())
    close(runtime.load(native)(ids)[0], want)  # here the library is built: model.onnx


def test_a_changed_portable_model_is_refused_by_its_hash(decoder, tmp_path):
    native = shutil.copytree(decoder[0], tmp_path / "copy.dz")
    path = native / "backend" / "model.portable.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="backend/model.portable.onnx"):
        runtime.load(native)


def test_inspect_names_the_portable_model(decoder, capsys):
    assert main(["inspect", str(decoder[0])]) == 0
    text = capsys.readouterr().out
    assert f"portable model backend/model.portable.onnx, run where {CAUSAL}" in text
    assert f"{GQA} x1" in text and "[ai.dayzero.CausalAttention]" in text


def _install_without_library(dest: Path) -> Path:
    """A copy of dayzero's packages without the native library, as on a machine where dayzero
    was installed without a C++ compiler."""
    skip = shutil.ignore_patterns("__pycache__", "_dayzero_ort_ops*")
    for package in ("backends", "compiler", "passes", "runtime"):
        shutil.copytree(ROOT / package, dest / package, ignore=skip)
    return dest


def test_without_the_library_the_portable_model_runs_with_one_warning(decoder, tmp_path):
    native, _, ids, want = decoder
    install = _install_without_library(tmp_path / "install")
    np.save(tmp_path / "ids.npy", ids)
    code = BLOCK_TORCH + textwrap.dedent(f"""
        import warnings
        import numpy as np, runtime
        from backends.onnxruntime import native_ops
        assert native_ops.__file__.startswith({str(install)!r}), native_ops.__file__
        assert native_ops.library_file() is None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = runtime.load({str(native)!r})
        warned = [str(w.message) for w in caught if w.category.__name__ ==
                  "PortableFallbackWarning"]
        assert len(warned) == 1, [str(w.message) for w in caught]
        print(warned[0])
        np.save({str(tmp_path / "y.npy")!r}, m(np.load({str(tmp_path / "ids.npy")!r}))[0])
        bad = sorted(k for k in sys.modules if k.split(".")[0] in ("torch", "onnx", "passes")
                     or k.startswith("compiler.frontend") or k == "backends.onnxruntime.lower")
        assert not bad, bad
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(install),
                                                            "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert CAUSAL in result.stdout and "model.portable.onnx" in result.stdout
    close(np.load(tmp_path / "y.npy"), want)


def test_exclude_kernels_gives_a_model_any_onnxruntime_runs(decoder):
    """backend/model.onnx opened by a bare InferenceSession: no dayzero session options, no
    custom-op library. Its weights are external data relative to the artifact root, the one
    plain ORT setting a consumer needs (ORT refuses locations that climb out of backend/)."""
    _, plain, ids, want = decoder
    assert not (plain / "backend" / "model.portable.onnx").exists()
    model = onnx.load(str(plain / "backend" / "model.onnx"), load_external_data=False)
    assert "ai.dayzero" not in {o.domain for o in model.opset_import}
    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(plain))
    session = ort.InferenceSession((plain / "backend" / "model.onnx").read_bytes(), options,
                                   providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: ids})
    close(got, want)


def test_weights_header_resaved_with_other_whitespace_is_refused(decoder, tmp_path):
    """Same tensors, a header 8 bytes longer, hashes fixed up: every weight moved by 8 bytes,
    and the load names a weight and its file instead of running on shifted bytes."""
    native = shutil.copytree(decoder[0], tmp_path / "copy.dz")
    rel = next(str(p.relative_to(native)) for p in (native / "weights").glob("*.safetensors"))
    data = (native / rel).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.dumps(json.loads(data[8:8 + length]), indent=None).encode()
    header += b" " * (-len(header) % 8 or 8) + b" " * 8
    assert len(header) != length
    (native / rel).write_bytes(struct.pack("<Q", len(header)) + header + data[8 + length:])
    fix_hash(native, rel)
    with pytest.raises(ArtifactError, match=f"reads weight '.+' at bytes .* of {rel}") as err:
        runtime.load(native)
    assert rel in err.value.where


def test_external_data_read_without_onnx_matches_onnx(decoder):
    """The load path's wire-format reader finds what onnx finds in both models."""
    for name in ("model.onnx", "model.portable.onnx"):
        path = decoder[0] / "backend" / name
        model = onnx.load(str(path), load_external_data=False)
        want = {t.name: {e.key: e.value for e in t.external_data}
                for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
        assert want and external_initializers(path.read_bytes()) == want


def test_align_observes_the_portable_model_where_the_library_is_missing(decoder, monkeypatch):
    from backends.onnxruntime import OnnxRuntimeBackend, native_ops
    from backends.onnxruntime.probe import installed_kernels
    from compiler.ir import parse_ir
    from runtime.artifact import Artifact

    native, _, ids, want = decoder
    artifact = Artifact(native)
    values = [v.name for n in parse_ir(artifact.graph_text()).nodes for v in n.outputs]
    monkeypatch.setattr(native_ops, "library", lambda: None)
    installed_kernels.cache_clear()
    try:
        with pytest.warns(native_ops.PortableFallbackWarning, match=CAUSAL):
            observer = OnnxRuntimeBackend().observe(artifact, values)
        outputs, observed = observer([ids])
    finally:
        installed_kernels.cache_clear()
    close(outputs[0], want)
    assert observed and set(observed) <= set(values)


def test_external_data_check_names_a_weight_no_header_holds_and_a_malformed_model(decoder):
    from backends.onnxruntime.external_data import check_external_data
    from runtime.artifact import Artifact

    native = decoder[0]
    data = (native / "backend" / "model.portable.onnx").read_bytes()
    locations = Artifact(native).weight_locations()
    check_external_data(data, "backend/model.portable.onnx", locations)
    name = sorted(locations)[0]
    del locations[name]
    with pytest.raises(ArtifactError, match=f"model.portable.onnx reads weight '{name}' from "
                       r"weights/.*, which holds no tensor of that name"):
        check_external_data(data, "backend/model.portable.onnx", locations)
    with pytest.raises(ArtifactError, match="is not a valid ONNX model"):
        check_external_data(data[:len(data) // 3], "backend/model.portable.onnx", locations)
