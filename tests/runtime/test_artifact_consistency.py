"""An artifact is trusted only as far as it is consistent (issue 33): manifest-only edits of real
ONNX Runtime artifacts (whose backend never parses graph.dzir) are refused at load, naming the
key and saying the artifact is inconsistent, where before they changed what the model accepts
(`index_inputs.input_ids.lo = -256` let token id -1 through, answering with row 255) or ended
in an OutputShapeError blaming the lowering. The hashes of the other files stay valid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import runtime
from compiler.errors import ArtifactError, DayzeroError, InputError
from compiler.ir import DType, Graph, TensorType, symbol
from compiler.writer import write_artifact

IDS = np.array([[0, 3, 255, 7]], np.int64)


def vocab_graph() -> Graph:
    """logits = linear(embedding(table, input_ids)): a 256-token vocabulary."""
    g = Graph("vocab")
    g.symbols["s0"] = (1, 32)
    ids = g.add_input("input_ids", TensorType(DType.i64, (1, symbol("s0"))))
    gen = torch.Generator().manual_seed(0)
    table = g.add_weight("embed", TensorType(DType.f32, (256, 8)),
                         torch.randn(256, 8, generator=gen))
    head = g.add_weight("head", TensorType(DType.f32, (5, 8)), torch.randn(5, 8, generator=gen))
    e = g.add_node("embedding", [table, ids], names=["e"]).output
    g.outputs = [g.add_node("linear", [e, head, None], names=["logits"]).output]
    return g


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return write_artifact(tmp_path_factory.mktemp("ort") / "m.dz", vocab_graph(), "onnxruntime")


@pytest.fixture
def artifact(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "m.dz"))


def edit(root: Path, change) -> Path:
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def refused(root: Path, **kw) -> DayzeroError:
    with pytest.raises(DayzeroError) as info:
        runtime.load(root, **kw)
    return info.value


def test_the_pristine_artifact_loads_and_refuses_token_minus_one(pristine):
    m = runtime.load(pristine)
    assert m(IDS)[0].shape == (1, 4, 5)
    with pytest.raises(InputError, match="holds -1"):
        m(np.array([[-1, 3]], np.int64))


def test_input_ids_lo_edited_to_minus_256_is_refused(artifact):
    edit(artifact, lambda m: m["index_inputs"]["input_ids"].update(lo=-256))
    err = refused(artifact)
    assert isinstance(err, ArtifactError)
    assert err.where == "manifest.json: index_inputs.input_ids.lo", err.message()
    assert "accepts [0, 256)" in err.what and "recompile" in err.fix


@pytest.mark.parametrize("change", [
    lambda e: e.update(lo=-256, op="index"),  # well-formed, but not what the graph does
    lambda e: e.update(hi=1000),
    lambda e: e.update(table="head"),
])
def test_index_ranges_the_graph_does_not_give_are_refused(artifact, change):
    edit(artifact, lambda m: change(m["index_inputs"]["input_ids"]))
    err = refused(artifact)
    assert isinstance(err, ArtifactError)
    assert err.what.startswith("the artifact is inconsistent: manifest.json: index_inputs")
    assert "graph.dzir gives" in err.what and "index_inputs" in err.where
    assert "edited or corrupted" in err.fix


def test_deleted_index_ranges_come_from_the_graph(artifact):
    edit(artifact, lambda m: m.pop("index_inputs"))
    m = runtime.load(artifact)
    with pytest.raises(InputError, match="holds -1"):
        m(np.array([[-1, 3]], np.int64))


@pytest.mark.parametrize("change, key", [
    (lambda m: m["outputs"][0].update(shape=[1, "2*s0", 5]), "outputs[0]"),
    (lambda m: m["outputs"][0].update(name="probs"), "outputs[0]"),
    (lambda m: (m["inputs"][0].update(name="ids"),
                m.update(index_inputs={"ids": m["index_inputs"]["input_ids"]})), "inputs[0]"),
    (lambda m: m["symbols"].update(s0=[1, 64]), "inputs[0]"),
    (lambda m: m["symbols"].update(s0=[2, 32]), "inputs[0]"),
    (lambda m: m["symbols"].update(s9=[1, 2]), "symbols.s9"),
])
def test_specs_and_symbols_the_graph_does_not_have_are_refused(artifact, change, key):
    edit(artifact, change)
    err = refused(artifact)
    assert isinstance(err, ArtifactError), err.message()
    assert err.what.startswith("the artifact is inconsistent: manifest.json"), err.what
    assert err.where.endswith(f"manifest.json: {key}"), err.where


def test_an_edited_output_shape_is_named_inconsistent_not_a_lowering_bug(artifact):
    """Before: load passed, and the first call raised OutputShapeError ('a lowering bug')."""
    edit(artifact, lambda m: m["outputs"][0].update(shape=[1, "2*s0", 5]))
    err = refused(artifact)
    assert "inconsistent" in err.what and "graph.dzir has ('logits', 'f32', (1, 's0', 5)" \
        in err.what


def test_the_check_reads_the_graph_text_without_the_ir_parser(pristine):
    """The IR parser (lark, sympy) costs seconds on a large graph: this check never loads it."""
    import subprocess
    import sys

    code = ("import sys, runtime\nruntime.load(sys.argv[1])\n"
            "print(sorted(m for m in ('sympy', 'lark', 'compiler.ir.parser') "
            "if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code, str(pristine)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_any_loader_can_ask_an_artifact_for_the_check(artifact):
    """`Artifact.check_consistency()` (what the partitioned loaders call): the graph's index
    ranges, or the inconsistency."""
    from runtime.artifact import open_artifact

    found = open_artifact(artifact).check_consistency()
    assert {k: (r.lo, r.hi, r.table) for k, r in found.items()} == {
        "input_ids": (0, 256, "embed")}
    edit(artifact, lambda m: m["outputs"][0].update(shape=[1, "2*s0", 5]))
    with pytest.raises(ArtifactError, match="inconsistent: manifest.json outputs"):
        open_artifact(artifact).check_consistency()


# -- a generation artifact: its settings against the step graph ------------------------------------

@pytest.fixture(scope="module")
def generation(tmp_path_factory) -> Path:
    from tests.generation.tiny_lms import compile_lm, tiny_lm

    return compile_lm(tiny_lm("llama"), tmp_path_factory.mktemp("gen") / "g.dz")


@pytest.fixture
def gen_copy(generation, tmp_path) -> Path:
    return Path(shutil.copytree(generation, tmp_path / "g.dz"))


def test_the_pristine_generation_artifact_generates(generation):
    out = runtime.load(generation).generate([[1, 2, 3]], max_new_tokens=3)
    assert out.shape == (1, 6)


@pytest.mark.parametrize("change, words", [
    (lambda g: g.update(vocab_size=255), "generation.vocab_size = 255"),
    (lambda g: g.update(layers=[[3, 16, 16, None]] * 2), "generation.layers[0]"),
    (lambda g: g.update(layers=[[2, 16, 8, None]] * 2), "generation.layers[0]"),
    (lambda g: g.update(layers=[[2, 16, 16, None]] * 3), "3 cache layers"),
    (lambda g: g.update(kv_cache_dtype="int8"), "i8 per token"),
    (lambda g: g.update(max_positions=4096), "generation.max_positions = 4096"),
])
def test_generation_settings_the_step_graph_does_not_have_are_refused(gen_copy, change, words):
    edit(gen_copy, lambda m: change(m["generation"]))
    err = refused(gen_copy)
    assert isinstance(err, ArtifactError) and err.what.startswith("the artifact is inconsistent")
    assert words in err.what, err.what


def test_an_eos_id_outside_the_vocabulary_is_refused(gen_copy):
    edit(gen_copy, lambda m: m["generation"].update(eos_token_ids=[2, 256]))
    err = refused(gen_copy)
    assert err.where.endswith("generation.eos_token_ids")
    assert "in [0, 255]" in err.what


def test_a_cache_larger_than_memory_is_refused_with_both_numbers(gen_copy):
    """2**50 bytes was accepted and ended in MemoryError at the first generate."""
    edit(gen_copy, lambda m: m["generation"].update(kv_cache_memory=2**50))
    err = refused(gen_copy)
    assert isinstance(err, ArtifactError) and "1125899906842624 bytes" in err.what
    assert "of memory available here" in err.what
    assert "--kv-cache-memory SIZE" in err.fix and "kv_cache_memory=SIZE" in err.fix
    m = runtime.load(gen_copy, kv_cache_memory="4MiB")  # the override is the way out
    assert m.generate([[1, 2, 3]], max_new_tokens=2).shape == (1, 5)


def test_an_oversized_cache_override_is_an_input_error(generation):
    err = refused(generation, kv_cache_memory=2**50)
    assert isinstance(err, InputError) and "kv_cache_memory=1125899906842624" in err.what


def test_mutated_generation_sections_fail_cleanly_or_generate_the_same(generation, tmp_path):
    """A seeded fuzz of the generation section alone (the rest of the manifest as written)."""
    import random

    from tests.runtime.test_manifest_fuzz import _mutate, _text

    root = Path(shutil.copytree(generation, tmp_path / "g.dz"))
    pristine = json.loads((root / "manifest.json").read_text())
    expected = runtime.load(root).generate([[1, 2, 3]], max_new_tokens=3)
    rng = random.Random(7)
    outcomes = {"error": 0, "same": 0}
    for case in range(60):
        manifest = json.loads(json.dumps(pristine))
        manifest["generation"] = _mutate({"generation": manifest["generation"]},
                                         rng).get("generation")  # None: a forward artifact
        (root / "manifest.json").write_text(_text(manifest, rng))
        try:
            got = runtime.load(root).generate([[1, 2, 3]], max_new_tokens=3)
        except DayzeroError:
            outcomes["error"] += 1
            continue
        except BaseException as exc:
            raise AssertionError(f"case {case}: {type(exc).__name__}: {exc}\n"
                                 f"{json.dumps(manifest['generation'])[:1500]}") from exc
        np.testing.assert_array_equal(got, expected, err_msg=f"case {case}")
        outcomes["same"] += 1
    assert outcomes["error"] > 20 and outcomes["same"] > 0, outcomes


def test_a_graph_that_is_not_utf8_is_an_artifact_error(artifact):
    """graph.dzir edited to hold invalid UTF-8 (and re-hashed): named, not a UnicodeDecodeError."""
    import hashlib

    data = (artifact / "graph.dzir").read_bytes() + b"\xed\xa0\x80\n"
    (artifact / "graph.dzir").write_bytes(data)
    edit(artifact, lambda m: m["files"]["graph.dzir"].update(
        size=len(data), sha256=hashlib.sha256(data).hexdigest()))
    err = refused(artifact)
    assert isinstance(err, ArtifactError) and "graph.dzir is not UTF-8 text" in err.what, err
