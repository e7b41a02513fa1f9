"""The typed manifest reader (issue 33): manifest.json is read like every other file (no links,
bounded), every field is typed and ranged with its key path in the error, and the bounds on
what an artifact asks for (safetensors headers, listed paths, the KV cache) hold before any
work. Each case is a manifest-only (or header-only) edit of a real artifact."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

import runtime
from compiler.cli import main
from compiler.errors import ArtifactError, DayzeroError, InputError
from compiler.writer import write_artifact
from runtime.artifact import open_artifact
from runtime.bounded_json import loads, nesting_depth
from runtime.host_memory import available_bytes
from runtime.manifest import Manifest, parse_manifest, read_manifest
from runtime.safetensors_io import read_header
from tests.runtime.conftest import mlp_graph


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return write_artifact(tmp_path_factory.mktemp("reader") / "m.dz", mlp_graph(), "reference")


@pytest.fixture
def artifact(pristine, tmp_path) -> Path:
    root = tmp_path / "m.dz"
    shutil.copytree(pristine, root)
    return root


def edit(root: Path, change) -> Path:
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def load_error(root: Path) -> DayzeroError:
    with pytest.raises(DayzeroError) as info:
        runtime.load(root)
    return info.value


def test_the_typed_manifest_keeps_the_raw_one(pristine):
    typed = read_manifest(pristine)
    assert isinstance(typed, Manifest) and typed.backend == "reference"
    assert [s.name for s in typed.inputs] == ["x"] and typed.inputs[0].shape == ("s0", 4)
    assert typed.symbols == {"s0": (2, 64)} and typed.parallel.world_size == 1
    assert typed.parallel.ranks[0].graph == "graph.dzir" and not typed.partitioned
    assert typed.files["graph.dzir"].size == (pristine / "graph.dzir").stat().st_size
    art = open_artifact(pristine)
    assert art.typed == typed and art.manifest is art.typed.raw
    assert art.manifest == json.loads((pristine / "manifest.json").read_text())
    with pytest.raises(AttributeError):
        typed.backend = "x"  # frozen


# -- manifest.json is read like every other file -------------------------------------------------

def test_a_symlinked_manifest_pointing_outside_is_refused(artifact, tmp_path):
    outside = tmp_path / "elsewhere.json"
    os.replace(artifact / "manifest.json", outside)
    (artifact / "manifest.json").symlink_to(outside)
    with pytest.raises(ArtifactError, match="manifest.json is a link") as info:
        open_artifact(artifact)
    assert info.value.where == str(artifact / "manifest.json")
    with pytest.raises(ArtifactError, match="is a link"):
        runtime.load(artifact)


def test_a_manifest_that_is_not_a_regular_file_is_refused(artifact):
    (artifact / "manifest.json").unlink()
    os.mkfifo(artifact / "manifest.json")  # opening it for reading must not block
    with pytest.raises(ArtifactError, match="not a regular file"):
        open_artifact(artifact)


def test_an_oversized_manifest_is_refused_unread(artifact):
    with open(artifact / "manifest.json", "ab") as f:
        f.truncate(65 * 2**20)  # sparse: no 65 MiB written
    with pytest.raises(ArtifactError, match=r"is 68157440 bytes, more than the 67108864"):
        open_artifact(artifact)


@pytest.mark.parametrize("data, words", [
    (b'{"format": "dayzero-artifact", "a": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested"),
    (b'{"format": "dayzero-artifact", "format": "dayzero-artifact"}', "appears twice"),
    (b'{"format": "\\ud800"}', "lone surrogate"),
    (b'{"format": 1e400}', "out of range"),
    (b'\xff{}', "codec can't decode"),
    (b'{"n": ' + b"9" * 5000 + b"}", "more than 100 digits"),
])
def test_unreadable_json_is_refused_with_the_reason(artifact, data, words):
    (artifact / "manifest.json").write_bytes(data)
    with pytest.raises(ArtifactError, match="manifest.json is not valid JSON") as info:
        open_artifact(artifact)
    assert words in info.value.what


def _random_json(rng, depth=0):
    roll = rng.random()
    if depth < 6 and roll < 0.3:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    if depth < 6 and roll < 0.6:
        return {rng.choice(["a", "[", '"}', "\\"]): _random_json(rng, depth + 1)
                for _ in range(rng.randrange(3))}
    return "".join(rng.choice('[]{}"\\a,:') for _ in range(rng.randrange(6)))


def _depth(value) -> int:
    if isinstance(value, (list, dict)):
        inner = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(v) for v in inner), default=0)
    return 0


def test_nesting_is_measured_outside_strings():
    import random

    assert nesting_depth(b'{"a": "[[[[[[", "b": [[1]]}') == 3
    assert nesting_depth(b'{"a": "\\"[[[["}') == 1
    assert nesting_depth(b'["\\\\", [["\\\\\\"]"]]]') == 3
    rng = random.Random(0)
    for _ in range(2000):
        value = _random_json(rng)
        assert nesting_depth(json.dumps(value).encode()) == _depth(value), value
    assert loads(b'[[[1]]]', max_depth=3, max_int_digits=5) == [[[1]]]
    with pytest.raises(ValueError, match="nested more than 2 deep"):
        loads(b'[[[1]]]', max_depth=2, max_int_digits=5)


# -- every field typed and ranged, named by its key path -------------------------------------------

@pytest.mark.parametrize("change, key", [
    (lambda m: m["parallel"].update(world_size=[1]), "parallel.world_size"),
    (lambda m: m["parallel"].update(world_size=2), "parallel.world_size"),
    (lambda m: m["parallel"].update(tensor_parallel="2"), "parallel.tensor_parallel"),
    (lambda m: m["parallel"].update(groups={"tp": [[5]]}), "parallel.groups.tp[0][0]"),
    (lambda m: m["parallel"].update(stages=[{"stage": 0, "nodes": [0]}]),
     "parallel.stages[0].nodes"),
    (lambda m: m["parallel"]["ranks"][0].update(coords={"tp": -1}),
     "parallel.ranks[0].coords.tp"),
    (lambda m: m["parallel"]["ranks"][0].update(segments=0), "parallel.ranks[0].segments"),
    (lambda m: m["parallel"]["ranks"][0].update(graph=7), "parallel.ranks[0].graph"),
    (lambda m: m.update(backend="x" * 65), "backend"),
    (lambda m: m.update(backend=["reference"]), "backend"),
    (lambda m: m.update(backend_options="fast"), "backend_options"),
    (lambda m: m.update(memory_plan=[1]), "memory_plan"),
    (lambda m: m.update(static_sizes=3), "static_sizes"),
    (lambda m: m.update(symbol_aliases={"seq": "s9"}), "symbol_aliases.seq"),
    (lambda m: m.update(symbol_aliases=[]), "symbol_aliases"),
    (lambda m: m.update(producer_version=5), "producer_version"),
    (lambda m: m.update(pipeline={"a": 1}), "pipeline"),
    (lambda m: m.update(graph="other.dzir"), "graph"),
    (lambda m: m["files"]["graph.dzir"].update(sha256="ab"), "graph.dzir"),
    (lambda m: m["files"]["graph.dzir"].update(size=-1), "graph.dzir"),
    (lambda m: m["inputs"].append(dict(m["inputs"][0])), "inputs[1].name"),
    (lambda m: m["inputs"][0].update(shape=[4] * 65), "inputs[0].shape"),
    (lambda m: m["inputs"][0].update(name=""), "inputs[0].name"),
    (lambda m: m["symbols"].update({"s 0": [1, 2]}), "symbols"),
    (lambda m: m["symbols"].update(s0=[2, 2**70]), "symbols.s0"),
    (lambda m: m.update(index_inputs={"x": {"lo": 0, "hi": 4, "table": "w1", "op": "pow"}}),
     "index_inputs.x"),
])
def test_each_field_is_refused_naming_its_key(artifact, change, key):
    err = load_error(edit(artifact, change))
    assert isinstance(err, ArtifactError), err.message()
    assert key in err.message(), err.message()


def test_an_index_range_against_its_op_is_refused_unparsed(artifact):
    edit(artifact, lambda m: m.update(index_inputs={
        "x": {"lo": -8, "hi": 8, "table": "w1", "op": "embedding"}}))
    err = load_error(artifact)
    assert err.where == "manifest.json: index_inputs.x.lo"
    assert "accepts [0, 8)" in err.what


@pytest.mark.parametrize("change", [
    lambda m: m["parallel"].update(world_size=[1]),
    lambda m: m["parallel"]["ranks"][0].update(rank="0"),
])
def test_inspect_reports_a_bad_parallel_section_as_an_artifact_error(artifact, capsys, change):
    edit(artifact, change)
    assert main(["inspect", str(artifact)]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and "TypeError" not in err
    assert "manifest.json: parallel." in err and "fix:" in err


# -- bounded before any file system call --------------------------------------------------------

@pytest.mark.parametrize("name, words", [
    ("a" * 1800, "too long (1800 bytes"),
    ("backend/" + "b" * 300, "too long"),
    ("x\0y", "not a plain relative path"),
    ("a/./b", "not a plain relative path"),
    ("/etc/passwd", "not a plain relative path"),
])
def test_a_listed_path_the_file_system_cannot_take_is_refused(artifact, name, words):
    edit(artifact, lambda m: m["files"].update({name: {"size": 1, "sha256": "0" * 64}}))
    with pytest.raises(ArtifactError, match="file listed in manifest.json") as info:
        open_artifact(artifact)
    assert words in info.value.what


def _safetensors(path: Path, header: bytes, data: bytes = b"") -> Path:
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


@pytest.mark.parametrize("header, words", [
    (b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested more than 8 deep"),
    (b'{"a": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}',
     "more than 20 digits"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}}', "twice"),
    (b'{"a": {"dtype": "F32", "shape": [' + b"1, " * 80 + b'1], "data_offsets": [0, 4]}}',
     "unreadable header entry"),
    (b'{"a": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": '
     b'[0, 18446744073709551615]}}', "unreadable header entry"),
    (b'{"__metadata__": [1]}', "__metadata__"),
    (b'{' + b",".join(b'"t%d": 0' % i for i in range(2**18 + 2)) + b'}', "more than the 262144"),
])
def test_a_hostile_safetensors_header_is_refused_cleanly(tmp_path, header, words):
    path = _safetensors(tmp_path / "w.safetensors", header, b"\0" * 4)
    with pytest.raises(ArtifactError, match="weights file w.safetensors") as info:
        read_header(path, "w.safetensors")
    assert words in info.value.what


def test_a_deep_safetensors_header_in_an_artifact_is_an_artifact_error(artifact):
    """Rewritten weights (re-hashed into the manifest): the header check still holds."""
    import hashlib

    rel = json.loads((artifact / "manifest.json").read_text())["parallel"]["ranks"][0]["weights"][0]
    path = _safetensors(artifact / rel, b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}")
    data = path.read_bytes()
    edit(artifact, lambda m: m["files"].update(
        {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}))
    err = load_error(artifact)
    assert isinstance(err, ArtifactError) and "nested more than 8 deep" in err.what


# -- the KV cache against the memory available ---------------------------------------------------

def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_available_memory_is_the_least_of_the_system_and_the_cgroup(tmp_path):
    proc = _write(tmp_path / "proc", {"meminfo": "MemTotal: 100 kB\nMemAvailable:   4096 kB\n",
                                      "self/cgroup": "0::/job\n"})
    cgroup = tmp_path / "cg"
    assert available_bytes(proc, cgroup) == 4096 * 1024  # no cgroup files: the system's
    _write(cgroup, {"job/memory.max": "3000000\n", "job/memory.current": "1000000\n"})
    assert available_bytes(proc, cgroup) == 2000000
    _write(cgroup, {"job/memory.max": "max\n"})
    assert available_bytes(proc, cgroup) == 4096 * 1024
    v1 = _write(tmp_path / "proc1", {"meminfo": "MemAvailable: 9000 kB\n",
                                     "self/cgroup": "4:memory:/box\n1:cpu:/\n"})
    _write(cgroup, {"memory/box/memory.limit_in_bytes": "1000\n",
                    "memory/box/memory.usage_in_bytes": "400\n"})
    assert available_bytes(v1, cgroup) == 600
    _write(cgroup, {"memory/box/memory.limit_in_bytes": "9223372036854771712\n"})
    assert available_bytes(v1, cgroup) == 9000 * 1024  # v1's "unlimited"
    assert available_bytes(tmp_path / "none", tmp_path / "none") is None


def test_sizes_are_parsed_within_bounds():
    from runtime.generation.spec import MAX_BYTES, parse_bytes

    assert parse_bytes("2GiB", "k") == 2 * 2**30 and parse_bytes(4096, "k") == 4096
    for bad in ["9" * 400 + "TiB", 2**61, "1e9", True, [1], "0.0001", "-5"]:
        with pytest.raises(DayzeroError, match="kv_cache_memory"):
            parse_bytes(bad, "kv_cache_memory")
    assert parse_bytes(MAX_BYTES, "k") == MAX_BYTES


def test_an_oversized_cache_override_is_refused_with_both_numbers(monkeypatch):
    from runtime.generation import spec as spec_module

    spec = spec_module.GenerationSpec((spec_module.LayerCache(2, 16, 16, None),), 256, 256, (2,),
                                      4 << 20, 16, 512, 2048)
    monkeypatch.setattr(spec_module, "available_bytes", lambda: 3 << 30)
    assert spec_module.checked_cache_memory(spec, None) == 4 << 20
    assert spec_module.checked_cache_memory(spec, 2 << 30) == 2 << 30
    with pytest.raises(InputError, match=r"kv_cache_memory=1125899906842624 \(1.05e\+06 GiB\) "
                                         r"is more than the 3221225472 bytes \(3 GiB\)") as info:
        spec_module.checked_cache_memory(spec, 2**50)
    assert "--kv-cache-memory SIZE" in info.value.fix and "kv_cache_memory=" in info.value.fix
    monkeypatch.setattr(spec_module, "available_bytes", lambda: None)  # unknown: not refused
    assert spec_module.checked_cache_memory(spec, 2**50) == 2**50


def test_parse_manifest_names_its_path():
    with pytest.raises(ArtifactError, match="not a dayzero artifact") as info:
        parse_manifest(b'{"format": "zip"}', "/x/manifest.json")
    assert info.value.where == "/x/manifest.json"


# -- static sizes: each size's artifact takes its size ---------------------------------------------

class _Top:
    """The top size's model, as SizedModel reads it: manifest, path, specs."""

    def __init__(self, entry, path, shape=(1, 4)):
        from runtime.specs import TensorSpec

        self.manifest = {"static_sizes": entry}
        self.path = path
        self.input_specs = [TensorSpec("ids", "i64", shape)]
        self.output_specs = []


def test_a_static_size_its_artifact_does_not_take_is_refused(tmp_path):
    from runtime.sized import SizedModel

    entry = {"dim": "seq", "inputs": [[0, 1]], "sizes": [{"size": 8, "path": "."}]}
    model = SizedModel(_Top(entry, tmp_path), "full", None, None)
    with pytest.raises(ArtifactError, match="inconsistent: manifest.json static_sizes lists . "
                                            "for seq = 8, but its input 0 has 4 at axis 1"):
        model.model_for(8)
    entry["sizes"][0]["size"] = 4
    assert SizedModel(_Top(entry, tmp_path), "full", None, None).model_for(4) is not None


@pytest.mark.parametrize("pairs", [[[1, 1]], [[0, 2]]])
def test_static_size_axes_outside_the_inputs_are_refused(tmp_path, pairs):
    from runtime.sized import SizedModel

    entry = {"dim": "seq", "inputs": pairs, "sizes": [{"size": 4, "path": "."}]}
    with pytest.raises(ArtifactError, match="static_sizes.inputs is not a list of"):
        SizedModel(_Top(entry, tmp_path), "full", None, None)
