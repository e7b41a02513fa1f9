"""backend/lowering.json is checked against its schema, and the thread counts it records are
bounded by this machine's CPUs (issue 33, item 5).

Each case rewrites the record of a real compiled artifact and its size and sha256 in the
manifest, so the artifact's hash check passes and the schema is what refuses the file.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import compiler
import runtime
from backends.onnxruntime.lower import WIDE_IO
from backends.onnxruntime.record_schema import MAX_RECORD_BYTES, WIDE_DTYPES
from backends.onnxruntime.session import MAX_THREADS, ThreadsClampedWarning, affinity_cpus
from compiler.cli import main
from compiler.errors import ArtifactError, DayzeroError, InputError
from examples.mlp import build

RECORD = "backend/lowering.json"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    model, inputs, dynamic = build()
    return compiler.compile(model, inputs, out=tmp_path_factory.mktemp("schema") / "mlp.dz",
                            dynamic_shapes=dynamic)


@pytest.fixture(scope="module")
def good_record(compiled) -> dict:
    return json.loads((compiled / RECORD).read_text())


def with_record(compiled: Path, folder: Path, data: bytes | dict) -> Path:
    """A copy of `compiled` whose lowering.json is `data`, listed with its size and hash."""
    if isinstance(data, dict):
        data = json.dumps(data).encode()
    out = folder / "edited.dz"
    shutil.copytree(compiled, out)
    (out / RECORD).write_bytes(data)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"][RECORD] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def edited(record: dict, path: str, value, delete: bool = False) -> dict:
    """`record` with the value at dotted `path` (list indices as numbers) replaced/deleted."""
    record = copy.deepcopy(record)
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    parent = record
    for key in keys[:-1]:
        parent = parent[key]
    if delete:
        del parent[keys[-1]]
    else:
        parent[keys[-1]] = value
    return record


RAW = [
    (b"not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b'{"opset": 21,', "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b'{"opset": NaN}', "not valid JSON"),
    (b'{"opset": ' + b"9" * 5000 + b"}", "not valid JSON"),
    (b"null", "'(top level)' should be an object"),
    (b"[]", "'(top level)' should be an object"),
    (b'"lowering"', "'(top level)' should be an object"),
    (b"42", "'(top level)' should be an object"),
]


@pytest.mark.parametrize("data, message", RAW)
def test_a_record_that_is_not_a_json_object_is_refused(compiled, tmp_path, data, message):
    error = load_error(with_record(compiled, tmp_path, data))
    assert message in error.what and error.what.startswith(RECORD)


EDITS = [  # (dotted path, new value or DELETE, key path named in the error)
    ("opset", "21", "opset"),
    ("opset", 21.0, "opset"),
    ("opset", True, "opset"),
    ("opset", -1, "opset"),
    ("session", [], "session"),
    ("session", None, "session"),
    ("session.intra_op_threads", -1, "session.intra_op_threads"),
    ("session.intra_op_threads", "4", "session.intra_op_threads"),
    ("session.intra_op_threads", 2.5, "session.intra_op_threads"),
    ("session.intra_op_threads", True, "session.intra_op_threads"),
    ("session.intra_op_threads", None, "session.intra_op_threads"),
    ("session.intra_op_threads", 2**63, "session.intra_op_threads"),
    ("session.inter_op_threads", -3, "session.inter_op_threads"),
    ("session.graph_optimization_level", "max", "session.graph_optimization_level"),
    ("session.execution_mode", 1, "session.execution_mode"),
    ("session.cpu_mem_arena", "yes", "session.cpu_mem_arena"),
    ("session.allow_spinning", "sometimes", "session.allow_spinning"),
    ("session.allow_spinning", 1, "session.allow_spinning"),
    ("nodes", {}, "nodes"),
    ("nodes.0", 1, "nodes[0]"),
    ("nodes.0.node", 1, "nodes[0].node"),
    ("nodes.0.onnx", "Relu", "nodes[0].onnx"),
    ("nodes.0.onnx", [["Relu"]], "nodes[0].onnx[0]"),
    ("nodes.0.lowering", {"a": [[[{}]]]}, "nodes[0].lowering"),
    ("variants", [], "variants"),
    ("variants", {"com.microsoft.Gelu": "3"}, "variants.com.microsoft.Gelu"),
    ("variants", {"com.microsoft.Gelu": -1}, "variants.com.microsoft.Gelu"),
    ("wide_io", [], "wide_io"),
    ("wide_io.inputs", {"x": "f32"}, "wide_io.inputs.x"),
    ("wide_io.outputs", [], "wide_io.outputs"),
    ("portable", [], "portable"),
    ("portable.model", "../../../etc/passwd", "portable.model"),
    ("portable.replaces", "ai.dayzero.CausalAttention", "portable.replaces"),
    ("portable.nodes.0.onnx", None, "portable.nodes[0].onnx"),
]
MISSING = ["opset", "session", "nodes", "nodes.0.onnx", "portable.model", "portable.nodes"]
UNKNOWN = ["extra", "session.threads", "wide_io.sideways", "nodes.0.why"]


@pytest.mark.parametrize("path, value, key", EDITS, ids=[f"{p}={v!r}"[:60] for p, v, _ in EDITS])
def test_every_schema_violation_names_the_file_and_key(compiled, good_record, tmp_path, path,
                                                       value, key):
    skip_without_portable(path, good_record)
    error = load_error(with_record(compiled, tmp_path, edited(good_record, path, value)))
    assert error.what.startswith(f"{RECORD}: '{key}' should be "), error.what
    assert error.where == f"{RECORD}: {key}" and "recompile" in error.fix


@pytest.mark.parametrize("path", MISSING)
def test_a_missing_required_key_is_named(compiled, good_record, tmp_path, path):
    skip_without_portable(path, good_record)
    error = load_error(with_record(compiled, tmp_path, edited(good_record, path, None, True)))
    key = path.replace(".0.", "[0].")
    assert error.what.startswith(f"{RECORD}: '{key}' is missing: it should be "), error.what
    assert error.where == f"{RECORD}: {key}" and "recompile" in error.fix


@pytest.mark.parametrize("path", UNKNOWN)
def test_an_unknown_key_is_named(compiled, good_record, tmp_path, path):
    error = load_error(with_record(compiled, tmp_path, edited(good_record, path, 2)))
    key = path.replace(".0.", "[0].")
    assert error.what.startswith(f"{RECORD}: '{key}' is not a key this file has"), error.what


def skip_without_portable(path: str, record: dict) -> None:
    if path.startswith("portable") and "portable" not in record:
        pytest.skip("dayzero's native kernels are not built here: no portable model")


def load_error(path: Path) -> ArtifactError:
    """The error loading `path` raises; it must be an ArtifactError, never anything else."""
    with pytest.raises(ArtifactError) as info:
        runtime.load(path)
    return info.value


def test_inspect_reports_a_malformed_record_without_a_traceback(compiled, good_record,
                                                                 tmp_path, capsys):
    out = with_record(compiled, tmp_path, edited(good_record, "nodes.0.onnx", 7))
    assert main(["inspect", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{RECORD}: 'nodes[0].onnx' should be a list" in err and "Traceback" not in err


def test_an_oversized_record_is_refused_unread(compiled, tmp_path, monkeypatch):
    import backends.onnxruntime.record_schema as schema

    monkeypatch.setattr(schema, "MAX_RECORD_BYTES", 100)
    out = with_record(compiled, tmp_path, (compiled / RECORD).read_bytes())
    assert "larger than" in load_error(out).what and MAX_RECORD_BYTES > 2**20


def test_the_schema_knows_every_wide_dtype_the_lowering_records():
    assert set(WIDE_DTYPES) == {d.value for d in WIDE_IO}


def test_the_compiled_record_itself_passes_and_runs(compiled):
    model = runtime.load(compiled)
    x = np.ones((3, 32), np.float32)
    assert model(x)[0].shape[0] == 3


# -- threads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["intra_op_threads", "inter_op_threads"])
@pytest.mark.parametrize("recorded", [5000, 100_000, 2**63 - 1])
def test_recorded_thread_counts_are_clamped_to_the_cpus(compiled, good_record, tmp_path, key,
                                                        recorded):
    cpus = affinity_cpus()
    out = with_record(compiled, tmp_path, edited(good_record, f"session.{key}", recorded))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = runtime.load(out)
    clamps = [str(w.message) for w in caught if w.category is ThreadsClampedWarning]
    assert clamps == [f"{RECORD}: session.{key} is {recorded}, more than the {cpus} CPUs this "
                      f"process may run on; using {cpus}"]
    options = model._executable.session.get_session_options()
    assert getattr(options, key.replace("threads", "num_threads")) == cpus
    assert f"{key}={cpus}" in model.describe()


def test_thread_counts_within_the_cpus_load_without_a_warning(compiled, good_record, tmp_path):
    out = with_record(compiled, tmp_path, edited(good_record, "session.intra_op_threads", 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThreadsClampedWarning)
        model = runtime.load(out)
    assert model._executable.session.get_session_options().intra_op_num_threads == 1


@pytest.mark.parametrize("key", ["intra_op_threads", "inter_op_threads"])
def test_an_override_above_the_cpus_is_refused(compiled, key):
    cpus = affinity_cpus()
    with pytest.raises(InputError) as info:
        runtime.load(compiled, session={key: cpus + 1})
    assert info.value.where == f"session.{key}"
    assert f"more than the {cpus} CPUs" in info.value.what and str(cpus) in info.value.fix
    model = runtime.load(compiled, session={key: cpus})  # the limit itself is fine
    options = model._executable.session.get_session_options()
    assert getattr(options, key.replace("threads", "num_threads")) == cpus


def test_run_session_override_above_the_cpus_is_refused(compiled, capsys):
    cpus = affinity_cpus()
    assert main(["run", str(compiled), "--session", f"intra_op_threads={cpus + 1}"]) == 1
    err = capsys.readouterr().err
    assert "'session.intra_op_threads'" in err and f"more than the {cpus} CPUs" in err
    assert "Traceback" not in err


def test_a_compile_option_beyond_any_machine_is_refused(tmp_path):
    model, inputs, dynamic = build()
    with pytest.raises(DayzeroError, match="backend_options.onnxruntime.session."
                                           "intra_op_threads"):
        compiler.compile(model, inputs, out=tmp_path / "m.dz", dynamic_shapes=dynamic,
                         backend_options={"onnxruntime": {"session": {
                             "intra_op_threads": MAX_THREADS + 1}}})
    assert not (tmp_path / "m.dz").exists()


def test_align_observes_with_recorded_threads_clamped(compiled, good_record, tmp_path):
    """`dayzero align` makes its own session (backends/onnxruntime/observe.py): the recorded
    thread counts are clamped there too, not handed to ONNX Runtime as they are."""
    from backends.onnxruntime import OnnxRuntimeBackend
    from runtime.artifact import open_artifact

    out = with_record(compiled, tmp_path, edited(good_record, "session.intra_op_threads", 5000))
    artifact = open_artifact(out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watcher = OnnxRuntimeBackend().observe(artifact, [])
    assert any(w.category is ThreadsClampedWarning for w in caught)
    options = watcher.executable.session.get_session_options()
    assert options.intra_op_num_threads == affinity_cpus()
