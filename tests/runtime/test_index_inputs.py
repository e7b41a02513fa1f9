"""Inputs that index a weight table, and inputs in another byte order, on every backend."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from compiler.errors import ArtifactError, InputError
from compiler.ir import DType, Graph, TensorType, symbol
from compiler.writer import write_artifact
from runtime.index_inputs import IndexRange, find_index_inputs

BACKENDS = ["reference", "onnxruntime"]


def lookup_graph() -> Graph:
    """y = linear(embedding(table, ids)): ids index a 16-row table."""
    g = Graph("lookup")
    g.symbols["s0"] = (1, 32)
    ids = g.add_input("ids", TensorType(DType.i64, (1, symbol("s0"))))
    gen = torch.Generator().manual_seed(0)
    table = g.add_weight("table", TensorType(DType.f32, (16, 4)), torch.randn(16, 4, generator=gen))
    w = g.add_weight("w", TensorType(DType.f32, (3, 4)), torch.randn(3, 4, generator=gen))
    e = g.add_node("embedding", [table, ids], names=["e"]).output
    g.outputs = [g.add_node("linear", [e, w, None], names=["y"]).output]
    return g


def scale_graph() -> Graph:
    g = Graph("scale")
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    w = g.add_weight("w", TensorType(DType.f32, (3,)), torch.tensor([0.5, -1.25, 3.0]))
    g.outputs = [g.add_node("mul", [x, w], names=["y"]).output]
    return g


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_endian_input_gives_the_native_result(tmp_path, backend):
    m = runtime.load(write_artifact(tmp_path / "m.dz", scale_graph(), backend))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(m(x.astype(">f4"))[0], m(x)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_endian_index_input(tmp_path, backend):
    m = runtime.load(write_artifact(tmp_path / "m.dz", lookup_graph(), backend))
    ids = np.array([[3, 15, 0, 7]], np.int64)
    np.testing.assert_array_equal(m(ids.astype(">i8"))[0], m(ids)[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [16, -1, 2**40])
def test_index_outside_the_table_is_an_input_error(tmp_path, backend, bad):
    m = runtime.load(write_artifact(tmp_path / "m.dz", lookup_graph(), backend))
    ids = np.array([[3, 15, bad, 7]], np.int64)
    with pytest.raises(InputError) as info:
        m(ids)
    assert info.value.what == (f"input 'ids' holds {bad} at position [0, 2], outside the valid "
                               "range [0, 15] of the weight table 'table' it indexes (embedding)")
    assert info.value.where == "input 'ids' at position [0, 2]"
    m(np.array([[0, 15]], np.int64))  # the ends of the range are fine


def test_the_manifest_records_the_index_inputs(tmp_path):
    out = write_artifact(tmp_path / "m.dz", lookup_graph(), "reference")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["index_inputs"] == {"ids": {"lo": 0, "hi": 16, "table": "table",
                                                "op": "embedding"}}


def test_a_malformed_index_entry_is_refused(tmp_path):
    out = write_artifact(tmp_path / "m.dz", lookup_graph(), "reference")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["index_inputs"]["ids"]["hi"] = "16"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="index_inputs entry 'ids'"):
        runtime.load(out)


def test_index_inputs_are_followed_through_views_and_casts():
    g = Graph("g")
    ids = g.add_input("ids", TensorType(DType.i32, (2, 3)))
    other = g.add_input("pos", TensorType(DType.i64, (6,)))
    table = g.add_weight("table", TensorType(DType.f32, (10, 4)), torch.zeros(10, 4))
    rows = g.add_weight("rows", TensorType(DType.f32, (4, 7)), torch.zeros(4, 7))
    flat = g.add_node("reshape", [ids], {"shape": (6,)}).output
    wide = g.add_node("cast", [flat], {"dtype": DType.i64}).output
    a = g.add_node("embedding", [table, wide]).output
    b = g.add_node("index_select", [rows, other], {"dim": 1}).output
    c = g.add_node("index", [table, other]).output
    g.outputs = [a, b, c]
    found = find_index_inputs(g)
    assert found["ids"] == IndexRange("ids", 0, 10, "table", "embedding")
    # pos picks along dim 1 of rows (7) and, wrapping negatives, rows of table ([-10, 10))
    assert found["pos"] == IndexRange("pos", 0, 7, "rows", "index_select")
    assert set(found) == {"ids", "pos"}


def test_an_index_of_a_computed_tensor_is_not_checked():
    g = Graph("g")
    x = g.add_input("x", TensorType(DType.f32, (4, 3)))
    i = g.add_input("i", TensorType(DType.i64, (2,)))
    g.outputs = [g.add_node("index_select", [x, i], {"dim": 0}).output]
    assert find_index_inputs(g) == {}
