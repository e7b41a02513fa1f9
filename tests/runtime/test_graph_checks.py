"""runtime.load checks what the executor trusts against graph.dzir, even after a re-hash."""

from __future__ import annotations

import hashlib
import json

import pytest

import runtime
from compiler.errors import ArtifactError
from compiler.writer import write_artifact
from tests.runtime.test_index_inputs import lookup_graph


def edit_manifest(out, edit):
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))


def rewrite_graph(out, old: str, new: str):
    """Edit graph.dzir and re-hash it in the manifest: only verification can catch it."""
    path = out / "graph.dzir"
    text = path.read_text()
    assert old in text
    data = text.replace(old, new).encode()
    path.write_bytes(data)
    edit_manifest(out, lambda m: m["files"]["graph.dzir"].update(
        size=len(data), sha256=hashlib.sha256(data).hexdigest()))


@pytest.fixture
def mlp_artifact(tmp_path, make_mlp):
    """A reference artifact: its backend executes graph.dzir, which is checked before."""
    return write_artifact(tmp_path / "m.dz", make_mlp(), "reference")


def test_a_graph_that_does_not_verify_is_refused(mlp_artifact):
    rewrite_graph(mlp_artifact, "f32[s0, 3] = linear", "f32[s0, 5] = linear")
    with pytest.raises(ArtifactError, match="graph.dzir does not verify"):
        runtime.load(mlp_artifact)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["inputs"][0].update(dtype="f64"), r"manifest.json inputs\[0\] is \('x', 'f64'"),
    (lambda m: m["inputs"][0].update(name="z"), r"inputs\[0\] is \('z'"),
    (lambda m: m["outputs"][0].update(shape=["s0", 4]),
     r"outputs\[0\] is \('y', 'f32', \('s0', 4\)"),
    (lambda m: m["symbols"].update(s0=[2, 6400]), r"inputs\[0\] is .*6400"),
    (lambda m: m["outputs"].append(dict(m["outputs"][0])), r"outputs\[1\] is \('y'.* has nothing"),
])
def test_specs_that_disagree_with_the_graph_are_refused(mlp_artifact, edit, message):
    edit_manifest(mlp_artifact, edit)
    with pytest.raises(ArtifactError, match=message) as info:
        runtime.load(mlp_artifact)
    assert "manifest.json" in info.value.where


def test_index_ranges_that_disagree_with_the_graph_are_refused(tmp_path):
    out = write_artifact(tmp_path / "m.dz", lookup_graph(), "reference")
    edit_manifest(out, lambda m: m["index_inputs"]["ids"].update(hi=1000))
    with pytest.raises(ArtifactError, match="index_inputs .* is not what graph.dzir gives"):
        runtime.load(out)


def test_without_recorded_index_ranges_the_graph_gives_them(tmp_path):
    """Artifacts written before index_inputs was recorded still get their ids checked (by
    backends that read graph.dzir)."""
    out = write_artifact(tmp_path / "m.dz", lookup_graph(), "reference")
    edit_manifest(out, lambda m: m.pop("index_inputs"))
    import numpy as np

    from compiler.errors import InputError
    with pytest.raises(InputError, match="input 'ids' holds -1"):
        runtime.load(out)(np.array([[1, -1]], np.int64))


def test_a_rank_graph_that_does_not_verify_is_refused(tmp_path, make_mlp):
    from types import SimpleNamespace

    from runtime.artifact import open_artifact
    from runtime.rank_exec import RankExecutor

    ranks = [SimpleNamespace(rank=r, coords={"tp": r}, graph=make_mlp()) for r in (0, 1)]
    out = write_artifact(tmp_path / "p.dz", make_mlp(), "reference", ranks=ranks,
                         manifest_extra={"parallel": {"world_size": 2}})
    RankExecutor(open_artifact(out, rank=1), 1)  # as written, it loads
    path = out / "graphs" / "rank-1.dzir"
    data = path.read_text().replace("%y: f32[s0, 3] = linear", "%y: f32[s0, 3] = relu").encode()
    path.write_bytes(data)
    edit_manifest(out, lambda m: m["files"]["graphs/rank-1.dzir"].update(
        size=len(data), sha256=hashlib.sha256(data).hexdigest()))
    with pytest.raises(ArtifactError, match="rank-1.dzir does not verify"):
        RankExecutor(open_artifact(out, rank=1), 1)


def test_onnxruntime_loads_without_parsing_the_graph(tmp_path, monkeypatch):
    """Parsing graph.dzir takes seconds on large models; ORT runs model.onnx instead."""
    import runtime.graph_checks

    out = write_artifact(tmp_path / "m.dz", lookup_graph(), "onnxruntime")
    monkeypatch.setattr(runtime.graph_checks, "parse_ir", None)  # would fail if called
    m = runtime.load(out)
    import numpy as np

    from compiler.errors import InputError
    with pytest.raises(InputError, match="input 'ids' holds 16"):  # ranges from the manifest
        m(np.array([[1, 16]], np.int64))
