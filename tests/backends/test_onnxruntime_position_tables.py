"""Rotary tables computed once at the longest sequence: proved position-wise or left alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import compiler
import runtime
from backends.onnxruntime.position_tables import precomputed_table
from compiler.ir import parse_ir

ROOT = Path(__file__).resolve().parents[2]

TABLE = """
graph tables {
  symbol s0 in [2, 40]
  input %x: f32[1, s0, 8]
  weight @freq: f32[4]
  %pos: i64[s0] = arange() {start=0, end=s0, step=1}
  %col: i64[1, s0, 1] = reshape(%pos) {shape=[1, s0, 1]}
  %posf: f32[1, s0, 1] = cast(%col) {dtype=f32}
  %angles: f32[1, s0, 4] = mul(%posf, @freq)
  %both: f32[1, s0, 8] = concat(%angles, %angles) {dim=-1}
  %cos: f32[1, s0, 8] = cos(%both)
  %table: f32[1, 1, s0, 8] = reshape(%cos) {shape=[1, 1, s0, 8]}
  %flipped: f32[1, s0, 8] = flip(%cos) {dims=[1]}
  %size: f32[] = full() {shape=[], value=s0, dtype=f32}
  %scaled: f32[1, s0, 8] = div(%cos, %size)
  %mixed: f32[1, 8, s0] = reshape(%cos) {shape=[1, 8, s0]}
  %input: f32[1, s0, 8] = mul(%cos, %x)
  return %table, %flipped, %scaled, %mixed, %input
}
"""


def _graph():
    g = parse_ir(TABLE)
    g.weight_data = {"freq": torch.tensor([1.0, 0.5, 0.25, 0.125])}
    return g


def _reference(seq: int) -> np.ndarray:
    angles = torch.arange(seq, dtype=torch.float32)[:, None] * torch.tensor([1, .5, .25, .125])
    return torch.cat([angles, angles], -1).cos().numpy()


def test_positional_table_is_computed_at_the_upper_bound():
    g = _graph()
    table = precomputed_table(g.outputs[0], g.symbols, g.weight_data)
    assert table.shape == (1, 1, 40, 8)
    np.testing.assert_allclose(table[0, 0], _reference(40), rtol=1e-6)
    np.testing.assert_allclose(table[0, 0, :7], _reference(7), rtol=1e-6)  # any shorter one


@pytest.mark.parametrize("index, why", [
    (1, "reversed along the positions: row i depends on s0"),
    (2, "divided by s0"),
    (3, "the reshape mixes the position axis with the features"),
    (4, "reads a model input"),
])
def test_tables_that_depend_on_the_size_are_left_alone(index, why):
    g = _graph()
    assert precomputed_table(g.outputs[index], g.symbols, g.weight_data) is None, why


def test_weights_without_data_are_not_guessed():
    g = _graph()
    g.weight_data = {}
    assert precomputed_table(g.outputs[0], g.symbols, g.weight_data) is None


def test_llama_rotary_tables_become_constants(tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import llama
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model, inputs, dynamic = llama.build()
    path = compiler.compile(model, inputs, out=tmp_path / "m.dz", dynamic_shapes=dynamic)
    graph = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert "CausalAttention" in ops and not ops & {"Cos", "Sin", "Range"}
    loaded = runtime.load(path)
    vocab = int(inputs[0].max()) + 1
    for seq in (3, 17, llama.MAX_SEQ):  # the longest reads the table's last row
        ids = torch.randint(0, vocab, (1, seq))
        with torch.no_grad():
            want = model(ids).numpy()
        np.testing.assert_allclose(loaded(ids)[0], want, rtol=1e-5, atol=1e-5)
