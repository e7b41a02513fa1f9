"""The artifact format: exact write/read round trips, atomic writes, and refusal of tampering."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from compiler.errors import ArtifactError, DayzeroError
from compiler.ir import DType, Graph, TensorType, parse_ir, print_ir
from compiler.writer import write_artifact
from runtime.artifact import FORMAT_NAME, FORMAT_VERSION, open_artifact

WEIGHT = "weights/model-00001-of-00001.safetensors"


def many_dtypes_graph() -> Graph:
    """One weight per dtype family, including 0-d, empty and odd-sized ones (alignment)."""
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2,)))
    data = {
        "a_f16": torch.randn(3, dtype=torch.float16),
        "b_f32": torch.randn(2, 3),
        "c_bf16": torch.randn(5).to(torch.bfloat16),
        "d_i64": torch.arange(7),
        "e_bool": torch.tensor([True, False, True]),
        "f_fp8": torch.randn(3).to(torch.float8_e4m3fn),
        "g_f64": torch.tensor(3.5, dtype=torch.float64),
        "h_empty": torch.zeros(0, 4),
        "i_u8": np.arange(5, dtype=np.uint8),
        "j_i32": np.array([[1, -2], [3, 4]], dtype=np.int32),
    }
    for name, value in data.items():
        if isinstance(value, np.ndarray):
            dtype, shape = DType.from_numpy(value.dtype), value.shape
        else:
            dtype, shape = DType.from_torch(value.dtype), tuple(value.shape)
        g.add_weight(name, TensorType(dtype, shape), value)
    g.outputs = [g.add_node("relu", [x]).output]
    return g


def raw(value) -> bytes:
    if isinstance(value, np.ndarray):
        return value.tobytes()
    return value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- round trip ------------------------------------------------------------------------------

def test_round_trip_graph_text_manifest_and_hashes(tmp_path, make_mlp):
    g = make_mlp()
    out = write_artifact(tmp_path / "m.dz", g, "reference",
                         manifest_extra={"pipeline": "fold_constants,eliminate_dead_code",
                                         "config": {"precision": "fp32"}})
    assert out == tmp_path / "m.dz"
    art = open_artifact(out)
    assert art.graph_text() == print_ir(g)
    assert print_ir(parse_ir(art.graph_text())) == print_ir(g)
    m = art.manifest
    assert (m["format"], m["format_version"]) == (FORMAT_NAME, FORMAT_VERSION) == \
        ("dayzero-artifact", 1)
    assert m["backend"] == "reference" and m["backend_options"] == {}
    assert m["inputs"] == [{"name": "x", "dtype": "f32", "shape": ["s0", 4]}]
    assert m["outputs"] == [{"name": "y", "dtype": "f32", "shape": ["s0", 3]}]
    assert m["symbols"] == {"s0": [2, 64]}
    assert m["pipeline"] == "fold_constants,eliminate_dead_code"
    assert m["config"] == {"precision": "fp32"}
    assert m["parallel"]["world_size"] == 1
    assert m["parallel"]["ranks"] == [{"rank": 0, "graph": "graph.dzir", "weights": [WEIGHT]}]
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == set(m["files"]) | {"manifest.json"}
    for rel, info in m["files"].items():
        assert info == {"size": (out / rel).stat().st_size, "sha256": sha(out / rel)}


def test_weights_bitwise_equal_for_every_dtype(tmp_path):
    g = many_dtypes_graph()
    out = write_artifact(tmp_path / "m.dz", g, "reference")
    art = open_artifact(out)
    as_np, as_torch = art.weights("np"), art.weights("torch")
    assert set(as_np) == set(as_torch) == set(g.weight_data)
    for name, value in g.weight_data.items():
        assert raw(as_torch[name]) == raw(value), name
        assert as_np[name].tobytes() == raw(value), name
        assert tuple(as_np[name].shape) == tuple(value.shape)
        assert as_torch[name].dtype == DType(g.weights[name].type.dtype).to_torch()
    assert art.weights()["c_bf16"].dtype.name == "bfloat16"


def test_weight_files_are_standard_safetensors(tmp_path):
    g = many_dtypes_graph()
    out = write_artifact(tmp_path / "m.dz", g, "reference")
    with safe_open(out / WEIGHT, framework="pt") as f:
        assert set(f.keys()) == set(g.weight_data)
        for name, value in g.weight_data.items():
            assert raw(f.get_tensor(name)) == raw(torch.as_tensor(value)), name


def test_locations_given_to_lower_point_at_the_bytes(tmp_path, registered):
    g = many_dtypes_graph()
    out = write_artifact(tmp_path / "m.dz", g, "recording", options={"opt": [1, 2]})
    seen = registered.seen
    art = open_artifact(out)
    assert seen["options"] == {"opt": [1, 2]}
    assert seen["weights"] == art.weight_locations()
    for name, loc in seen["weights"].items():
        blob = (out / loc.file).read_bytes()
        assert blob[loc.offset:loc.offset + loc.nbytes] == raw(g.weight_data[name]), name
        assert loc.offset % DType(loc.dtype).itemsize == 0, f"{name} is misaligned"
        assert loc.dtype == g.weights[name].type.dtype.value
        assert loc.shape == tuple(g.weights[name].type.shape)
    header_len = struct.unpack("<Q", (out / WEIGHT).read_bytes()[:8])[0]
    first = min(loc.offset for loc in seen["weights"].values())
    assert first == 8 + header_len and header_len % 8 == 0
    assert (out / "backend/plan/notes.txt").read_bytes() == b"hello"
    assert art.manifest["files"]["backend/top.bin"]["size"] == 7
    assert art.payload_path("plan/notes.txt") == out / "backend/plan/notes.txt"
    assert art.manifest["backend_options"] == {"opt": [1, 2]}


def test_weights_are_mapped_not_copied(tmp_path, make_mlp):
    g = make_mlp()
    out = write_artifact(tmp_path / "m.dz", g, "reference")
    art = open_artifact(out)
    locations = art.weight_locations()
    w_np = art.weights("np")["w1"]
    mm = art._map(WEIGHT, "r")
    assert w_np.ctypes.data == mm.ctypes.data + locations["w1"].offset
    assert not w_np.flags.writeable
    w_t = art.weights("torch")["w1"]
    assert w_t.data_ptr() == art._map(WEIGHT, "c").ctypes.data + locations["w1"].offset
    w_t.add_(1.0)  # copy-on-write: the file must not change
    assert sha(out / WEIGHT) == art.manifest["files"][WEIGHT]["sha256"]


def test_shards_are_bounded_and_progress_counts_bytes(tmp_path):
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (4,)))
    for i in range(7):
        g.add_weight(f"w{i}", TensorType(DType.f32, (10,)), torch.full((10,), float(i)))
    g.add_weight("big", TensorType(DType.f32, (100,)), torch.arange(100.0))
    g.outputs = [x]
    done = []
    out = write_artifact(tmp_path / "m.dz", g, "reference", shard_bytes=100,
                         progress=done.append)
    assert sum(done) == 7 * 40 + 400
    files = open_artifact(out).manifest["parallel"]["ranks"][0]["weights"]
    assert files == [f"weights/model-{i:05d}-of-00005.safetensors" for i in range(1, 6)]
    art = open_artifact(out)
    for file in files:
        names = [n for n, loc in art.weight_locations().items() if loc.file == file]
        total = sum(art.weight_locations()[n].nbytes for n in names)
        assert total <= 100 or names == ["big"]
    weights = art.weights()
    for i in range(7):
        np.testing.assert_array_equal(weights[f"w{i}"], np.full(10, i, np.float32))
    np.testing.assert_array_equal(weights["big"], np.arange(100, dtype=np.float32))


def test_graph_without_weights(tmp_path):
    g = parse_ir("graph main {\n  input %x: f32[3]\n  %y: f32[3] = neg(%x)\n  return %y\n}\n")
    art = open_artifact(write_artifact(tmp_path / "m.dz", g, "reference"))
    assert art.weights() == {} and art.manifest["parallel"]["ranks"][0]["weights"] == []


# -- writer refusals and atomicity -------------------------------------------------------------

def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_failed_lower_leaves_nothing_behind(tmp_path, registered, make_mlp):
    with pytest.raises(RuntimeError, match="lowering exploded"):
        write_artifact(tmp_path / "m.dz", make_mlp(), "failing")
    assert leftovers(tmp_path) == []


def test_existing_output_is_refused_without_force(tmp_path, make_mlp):
    out = write_artifact(tmp_path / "m.dz", make_mlp(0), "reference")
    before = sha(out / WEIGHT)
    with pytest.raises(DayzeroError, match="already exists") as info:
        write_artifact(out, make_mlp(1), "reference")
    assert "--force" in info.value.fix
    assert sha(out / WEIGHT) == before


def test_force_replaces_only_after_success(tmp_path, registered, make_mlp):
    out = write_artifact(tmp_path / "m.dz", make_mlp(0), "reference")
    before = sha(out / WEIGHT)
    with pytest.raises(RuntimeError):
        write_artifact(out, make_mlp(1), "failing", force=True)
    assert sha(out / WEIGHT) == before and leftovers(tmp_path) == ["m.dz"]
    write_artifact(out, make_mlp(1), "reference", force=True)
    assert sha(out / WEIGHT) != before and leftovers(tmp_path) == ["m.dz"]
    np.testing.assert_array_equal(open_artifact(out).weights()["w1"],
                                  make_mlp(1).weight_data["w1"].numpy())


def test_force_never_deletes_something_that_is_not_an_artifact(tmp_path, make_mlp):
    precious = tmp_path / "src"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(DayzeroError, match="not a dayzero artifact"):
        write_artifact(precious, make_mlp(), "reference", force=True)
    assert (precious / "notes.txt").read_text() == "keep me"
    assert leftovers(tmp_path) == ["src"]


def test_bad_weight_data_names_the_weight(tmp_path, make_mlp):
    g = make_mlp()
    g.weight_data["b1"] = torch.zeros(8, dtype=torch.float64)
    with pytest.raises(DayzeroError, match="weight 'b1' holds f64\\[8\\] data but the graph "
                                           "declares f32\\[8\\]"):
        write_artifact(tmp_path / "m.dz", g, "reference")
    del g.weight_data["b1"]
    with pytest.raises(DayzeroError, match="weight 'b1' has no data"):
        write_artifact(tmp_path / "m.dz", g, "reference")
    assert leftovers(tmp_path) == []


def test_payload_cannot_escape_backend_folder(tmp_path, registered, monkeypatch, make_mlp):
    monkeypatch.setattr(registered, "lower", lambda self, g, w, o: {"../evil": b"x"})
    with pytest.raises(DayzeroError, match="not a plain relative path"):
        write_artifact(tmp_path / "m.dz", make_mlp(), "recording")
    assert leftovers(tmp_path) == []


def test_manifest_values_must_be_json(tmp_path, make_mlp):
    with pytest.raises(DayzeroError, match="backend options cannot be stored"):
        write_artifact(tmp_path / "m.dz", make_mlp(), "reference", options={"f": object()})
    with pytest.raises(ValueError, match="writer owns"):
        write_artifact(tmp_path / "m.dz", make_mlp(), "reference", manifest_extra={"files": 1})
    assert leftovers(tmp_path) == []


# -- the reader refuses damaged artifacts ------------------------------------------------------

@pytest.fixture
def artifact(tmp_path, make_mlp) -> Path:
    return write_artifact(tmp_path / "m.dz", make_mlp(), "reference")


def edit_manifest(root: Path, change) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_truncated_weights_file(artifact):
    path = artifact / WEIGHT
    path.write_bytes(path.read_bytes()[:-4])
    for verify in ("full", "size"):
        with pytest.raises(ArtifactError, match=f"file {WEIGHT} is .* bytes, the manifest says"):
            open_artifact(artifact, verify=verify)


def test_edited_graph_text(artifact):
    path = artifact / "graph.dzir"
    path.write_text(path.read_text().replace("relu", "tanh"))
    with pytest.raises(ArtifactError, match="file graph.dzir does not match its sha256") as info:
        open_artifact(artifact)
    assert info.value.where == str(path)


def test_edited_weight_bytes_full_vs_size(artifact):
    path = artifact / WEIGHT
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(ArtifactError, match=f"file {WEIGHT} does not match its sha256"):
        open_artifact(artifact)
    open_artifact(artifact, verify="size")  # documented trade-off: size mode skips weight hashes


def test_wrong_format_version(artifact):
    edit_manifest(artifact, lambda m: m.update(format_version=2))
    with pytest.raises(ArtifactError, match="format version 2 is not supported; this dayzero "
                                            "reads version 1") as info:
        open_artifact(artifact)
    assert "recompile" in info.value.fix


def test_not_an_artifact(tmp_path, artifact):
    edit_manifest(artifact, lambda m: m.update(format="something-else"))
    with pytest.raises(ArtifactError, match="not a dayzero artifact"):
        open_artifact(artifact)
    with pytest.raises(ArtifactError, match="has no manifest.json"):
        open_artifact(artifact / "weights")
    with pytest.raises(ArtifactError, match="is not an artifact directory"):
        open_artifact(tmp_path / "nowhere")
    (artifact / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="manifest.json is not valid JSON"):
        open_artifact(artifact)


def test_missing_file(artifact):
    (artifact / "graph.dzir").unlink()
    with pytest.raises(ArtifactError, match="file graph.dzir listed in the manifest is missing"):
        open_artifact(artifact)


def test_unlisted_file(artifact):
    (artifact / "backend").mkdir()
    (artifact / "backend" / "extra.so").write_bytes(b"\0")
    with pytest.raises(ArtifactError, match="file backend/extra.so is not listed"):
        open_artifact(artifact)


def test_manifest_paths_cannot_escape(artifact):
    (artifact.parent / "outside.txt").write_text("x")
    edit_manifest(artifact, lambda m: m["files"].update(
        {"../outside.txt": {"size": 1, "sha256": sha(artifact.parent / "outside.txt")}}))
    with pytest.raises(ArtifactError, match="'../outside.txt' is not a plain relative path"):
        open_artifact(artifact)


def test_symlinked_file_is_refused(artifact):
    target = artifact.parent / "graph_copy.dzir"
    os.replace(artifact / "graph.dzir", target)
    (artifact / "graph.dzir").symlink_to(target)
    with pytest.raises(ArtifactError, match="file graph.dzir is a link or lies outside"):
        open_artifact(artifact)


def test_payload_path_must_be_listed(artifact):
    with pytest.raises(ArtifactError, match="no payload file backend/model.onnx"):
        open_artifact(artifact).payload_path("model.onnx")
