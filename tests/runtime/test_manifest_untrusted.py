"""Untrusted artifacts (issue 16): a manifest or graph.dzir edited by someone else (and re-hashed,
so the hash check passes) ends in the project's own error naming the field, quickly: never a raw
exception, never a hang. Regression cases for fields that crashed or hung the loader, and a fuzz
of runtime.load over mutated manifests and graph texts."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runtime
from compiler.errors import ArtifactError, DayzeroError
from compiler.writer import write_artifact
from runtime.dims import dim_symbols, eval_dim
from tests.compiler.test_ir_fuzz import _TOKEN, FRAGMENTS, SAME_KIND, _kind
from tests.runtime.conftest import mlp_graph

SECONDS = 5  # per case; a load of this artifact takes tens of milliseconds


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return write_artifact(tmp_path_factory.mktemp("pristine") / "m.dz", mlp_graph(), "reference")


def _copy(pristine: Path, tmp: Path) -> Path:
    root = tmp / f"case{len(list(tmp.iterdir()))}"
    shutil.copytree(pristine, root)
    return root


def _write(root: Path, manifest_text: str | None = None, graph_text: str | None = None) -> None:
    """Replace manifest.json and/or graph.dzir; graph.dzir is re-hashed into the manifest."""
    manifest = json.loads((root / "manifest.json").read_text())
    if graph_text is not None:
        data = graph_text.encode()
        (root / "graph.dzir").write_bytes(data)
        manifest["files"]["graph.dzir"] = {"size": len(data),
                                           "sha256": hashlib.sha256(data).hexdigest()}
        manifest_text = manifest_text or json.dumps(manifest)
    if manifest_text is not None:
        (root / "manifest.json").write_text(manifest_text)


def _alarm(*_):
    raise TimeoutError(f"runtime.load took more than {SECONDS} s")


def _load_error(root: Path) -> DayzeroError | None:
    """The DayzeroError runtime.load raises (None if it loads), within SECONDS."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    try:
        runtime.load(root)
    except DayzeroError as err:
        return err
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return None


def _edit(pristine: Path, tmp: Path, change, raw: dict[str, str] | None = None) -> Path:
    """A copy whose manifest `change(manifest)` edited; `raw` replaces JSON placeholders with
    text json.dumps cannot write (5000-digit integers, 100000-deep nesting)."""
    root = _copy(pristine, tmp)
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    text = json.dumps(manifest)
    for placeholder, replacement in (raw or {}).items():
        text = text.replace(json.dumps(placeholder), replacement)
    _write(root, manifest_text=text)
    return root


def _set_dim(dim):
    def change(m):
        m["inputs"][0]["shape"][0] = dim
    return change


@pytest.mark.parametrize("dim", [
    "Max()", "Mod()", "Mod(s0)", "floor()", "floor(s0, 2)", "Max(s0, key=1)", "Max(*s0)",
    "((((s0**64)**64)**64)**64)**64", "(((((s0**64)**64)**64)**64)**64)**64",
    "((((9**64)**64)**64)**64)**64", "9**9**9**9**9**9**9**9**9**9**9**9**9",
    "s0**100000000", "2**s0", "s0**(-1)", "-" * 100000 + "s0", "(" * 300 + "s0" + ")" * 300,
    "+".join(["s0"] * 300), "s0" + " " * 2000, "9" * 5000, "True", "s0.bit_length()", "",
])
def test_bad_dims_name_their_field(pristine, tmp_path, dim):
    start = time.perf_counter()
    err = _load_error(_edit(pristine, tmp_path, _set_dim(dim)))
    assert isinstance(err, ArtifactError), err
    assert err.where == "manifest.json: inputs[0].shape[0]", err.message()
    assert time.perf_counter() - start < SECONDS


@pytest.mark.parametrize("change, raw, field", [
    (lambda m: m.update(backend_options="DEEP"), {"DEEP": "[" * 100000 + "]" * 100000},
     "nested"),
    (lambda m: m.update(backend_options="DEEP"), {"DEEP": "[" * 100 + "]" * 100}, "nested"),
    (lambda m: m["symbols"].update(s0=[2, "BIG"]), {"BIG": "9" * 5000}, "digits"),
    (lambda m: m["files"]["graph.dzir"].update(size="BIG"), {"BIG": "-" + "9" * 5000},
     "digits"),
    (lambda m: m.update(pipeline="NAN"), {"NAN": "NaN"}, "not JSON"),
])
def test_unreadable_json_is_an_artifact_error(pristine, tmp_path, change, raw, field):
    err = _load_error(_edit(pristine, tmp_path, change, raw))
    assert isinstance(err, ArtifactError) and field in err.what, err


@pytest.mark.parametrize("change, field", [
    (lambda m: m["symbols"].update(s0=[64, 2]), "symbols.s0"),
    (lambda m: m["symbols"].update(s0=[-1, 2]), "symbols.s0"),
    (lambda m: m["symbols"].update(s0=[2, 1.5]), "symbols.s0"),
    (lambda m: m["inputs"][0].update(shape="s0"), "inputs[0].shape"),
    (lambda m: m["inputs"][0].update(dtype=["f32"]), "inputs[0].dtype"),
    (lambda m: m["inputs"][0].update(name={"a": 1}), "inputs[0].name"),
    (lambda m: m["outputs"].__setitem__(0, ["y", "f32", [1]]), "outputs[0]"),
    (lambda m: m["outputs"][0]["shape"].__setitem__(1, True), "outputs[0].shape[1]"),
    (lambda m: m["outputs"][0]["shape"].__setitem__(1, -3), "outputs[0].shape[1]"),
    (lambda m: m["outputs"][0]["shape"].__setitem__(1, "s7"), "outputs[0].shape"),
])
def test_malformed_specs_name_their_field(pristine, tmp_path, change, field):
    err = _load_error(_edit(pristine, tmp_path, change))
    assert isinstance(err, ArtifactError), err
    assert err.where == f"manifest.json: {field}", err.message()


@pytest.mark.parametrize("change, what", [
    (lambda m: m["parallel"].update(world_size="2"), "world_size"),
    (lambda m: m["parallel"].update(world_size=0), "world_size"),
    (lambda m: m["parallel"].update(world_size=[1]), "world_size"),
    (lambda m: m["parallel"]["ranks"][0]["weights"].append(["x"]), "parallel.ranks"),
    (lambda m: m["parallel"]["ranks"][0].update(rank=True), "parallel.ranks"),
    (lambda m: m.update(backend_options=[1]), "backend_options"),
    (lambda m: m["files"].update({"graph.dzir": [1]}), "graph.dzir"),
])
def test_malformed_fields_are_artifact_errors(pristine, tmp_path, change, what):
    err = _load_error(_edit(pristine, tmp_path, change))
    assert isinstance(err, ArtifactError) and what in err.message(), err


def test_dims_evaluate_within_bounds():
    assert eval_dim("floor(s0/2) + s0**2", {"s0": 6}) == 39
    assert dim_symbols("Max(1, s0 - 3)*s1") == {"s0", "s1"}
    with pytest.raises(ArtifactError, match="too large"):
        eval_dim("s0**8", {"s0": 2**20})
    with pytest.raises(ArtifactError, match="too large"):
        eval_dim("s0*s0*s0*s0", {"s0": 2**40})


def test_a_rehashed_graph_that_hung_the_parser_is_refused(pristine, tmp_path):
    root = _copy(pristine, tmp_path)
    text = (root / "graph.dzir").read_text().replace("f32[8, 4]", "f32[9**(9**9), 4]")
    _write(root, graph_text=text)
    code = ("import sys, runtime\nfrom compiler.errors import DayzeroError\ntry:\n"
            "    runtime.load(sys.argv[1])\nexcept DayzeroError as e:\n    print(e.where)\n")
    done = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("graph.dzir: line 4, column 19"), done.stdout


# -- fuzz ------------------------------------------------------------------------------------

VALUES = [None, True, 0, -1, 1.5, 2**62, "", "s0", "s9", "f32", "Max()", "Mod()", "s0**64",
          "((s0**8)**8)**8", "../x", "/etc/passwd", [], [1], [None], {}, {"a": 1}, ["s0", 4],
          [2, 1], "BIG", "DEEP"]
RAW = {"BIG": "9" * 5000, "DEEP": "[" * 5000 + "]" * 5000}


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@st.composite
def manifest_edits(draw, manifest: dict):
    edits = []
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from([p for p in _paths(manifest) if p]))
        edits.append((path, draw(st.sampled_from(["set", "set", "set", "delete"])),
                      draw(st.sampled_from(VALUES))))
    return edits


def _apply(manifest: dict, edits) -> None:
    for path, kind, value in edits:
        parent = manifest
        try:
            for key in path[:-1]:
                parent = parent[key]
            if kind == "delete":
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed the path


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_manifests_load_or_fail_with_our_error(pristine, tmp_path, data):
    manifest = json.loads((pristine / "manifest.json").read_text())
    edits = data.draw(manifest_edits(manifest))
    root = _edit(pristine, tmp_path, lambda m: _apply(m, edits), RAW)
    _load_error(root)  # a DayzeroError or a model; anything else fails the test


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_graph_texts_load_or_fail_with_our_error(pristine, tmp_path, data):
    text = (pristine / "graph.dzir").read_text()
    for _ in range(data.draw(st.integers(1, 3))):
        tokens = list(_TOKEN.finditer(text))
        m = data.draw(st.sampled_from(tokens))
        piece = data.draw(st.sampled_from(SAME_KIND[_kind(m.group())] + FRAGMENTS))
        text = text[:m.start()] + piece + text[m.end():]
    root = _copy(pristine, tmp_path)
    _write(root, graph_text=text)
    _load_error(root)
