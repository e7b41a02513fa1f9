"""quantize_weights: linears -> quantized_linear in MatMulNBits' layout, and what runs it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import compiler
import runtime
from backends.onnxruntime.lower import lower_graph
from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.ir import parse_ir, print_ir
from passes import parse_pipeline
from passes.quantize_weights import quantize, quantize_half_scales

ROOT = Path(__file__).resolve().parents[2]

TEXT = """
graph main {
  symbol s0 in [1, 16]
  input %x: f32[s0, 64]
  weight @w: f32[6, 64]
  weight @b: f32[6]
  weight @odd: f32[3, 6]
  %y: f32[s0, 6] = linear(%x, @w, @b)
  %z: f32[s0, 3] = linear(%y, @odd, _)
  return %z
}
"""


def _graph(seed: int = 0):
    g = parse_ir(TEXT)
    gen = torch.Generator().manual_seed(seed)
    g.weight_data = {name: torch.randn([int(d) for d in v.shape], generator=gen)
                     for name, v in g.weights.items()}
    return g


def test_linear_becomes_quantized_linear_text():
    g = _graph()
    parse_pipeline("quantize_weights{bits=4,group_size=32}")[0].run(g)
    assert print_ir(g) == EXPECTED
    assert print_ir(parse_ir(print_ir(g))) == print_ir(g)


EXPECTED = """graph main {
  symbol s0 in [1, 16]
  input %x: f32[s0, 64]
  weight @b: f32[6]
  weight @odd: f32[3, 6]
  weight @w.q4: u8[6, 2, 16]
  weight @w.scales: f16[12]
  %y: f32[s0, 6] = quantized_linear(%x, @w.q4, @w.scales, @b) {bits=4, group_size=32, \
in_features=64, activations="float"}
  %z: f32[s0, 3] = linear(%y, @odd, _)
  return %z
}
"""  # the 6-feature linear is not a multiple of the group size: it stays float


@pytest.mark.parametrize("bits", [4, 8])
def test_codes_are_within_half_a_step_and_packed_low_nibble_first(bits):
    w = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    w[0, 3], w[1, 40] = 9.0, -9.0   # a positive and a negative extreme
    w[0, 7] = -8.9                  # beyond the top code on the other side: clamps
    codes, scales = quantize(w, bits, 32)
    half = 2 ** (bits - 1)
    if bits == 4:
        assert codes.shape == (5, 2, 16)
        unpacked = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(5, 2, 32)
    else:
        assert codes.shape == (5, 2, 32)
        unpacked = codes
    step = scales.reshape(5, 2, 1)
    blocks = w.reshape(5, 2, 32)
    extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
    assert torch.equal(step, extreme / -half)  # the extreme maps to code 0 (-half), exactly
    assert scales[0] == -9.0 / half and scales[3] == 9.0 / half
    assert unpacked[0, 0, 3] == 0 and unpacked[1, 1, 8] == 0
    dequantized = (unpacked.float() - half) * step
    error = (dequantized - blocks).abs()
    clamped = (blocks / step).round() > half - 1
    assert clamped[0, 0, 7] == (bits == 4)  # -8.9 / (9 / 8) rounds to 8, past the top code 7
    assert error[~clamped].le(step.abs().expand(5, 2, 32)[~clamped] / 2 + 1e-6).all()
    assert error[clamped].le(step.abs().expand(5, 2, 32)[clamped] + 1e-6).all()


def test_blocks_of_zeros_get_scale_one_and_the_middle_code():
    codes, scales = quantize(torch.zeros(2, 32), 4, 32)
    assert torch.equal(scales, torch.ones(2)) and torch.equal(codes, torch.full((2, 1, 16), 0x88,
                                                                              dtype=torch.uint8))


@pytest.mark.parametrize("bits", [4, 8])
def test_reference_runs_exactly_the_dequantized_weights(bits):
    g = _graph()
    w = g.weight_data["w"].clone()
    parse_pipeline(f"quantize_weights{{bits={bits},group_size=32}}")[0].run(g)
    codes, scales = quantize_half_scales(w, bits, 32)  # a float32 weight's rule
    assert scales.dtype == torch.float16
    if bits == 4:
        codes = torch.stack([codes & 15, codes >> 4], dim=-1)
    dequantized = ((codes.reshape(6, 2, 32).float() - 2 ** (bits - 1))
                   * scales.float().reshape(6, 2, 1)).reshape(6, 64)
    x = torch.randn(5, 64)
    y = torch.nn.functional.linear(x, dequantized, g.weight_data["b"])
    want = torch.nn.functional.linear(y, g.weight_data["odd"])
    torch.testing.assert_close(run_graph(g, g.weight_data, [x])[0], want, rtol=1e-5, atol=1e-5)


def test_onnxruntime_runs_the_codes_with_matmul_nbits():
    g = _graph()
    parse_pipeline("quantize_weights{bits=4,group_size=32}")[0].run(g)
    lowered = lower_graph(g, _locations(g))
    assert lowered.variants() == {"com.microsoft.MatMulNBits": 1}


def _locations(g):
    from backends import WeightLocation

    return {name: WeightLocation("weights/w.safetensors", 0, 4, v.dtype.value,
                                 tuple(int(d) for d in v.shape)) for name, v in g.weights.items()}


def test_bad_options_name_the_pass():
    with pytest.raises(DayzeroError, match="quantize_weights: bits=3"):
        parse_pipeline("quantize_weights{bits=3}")


def test_llama_int8_and_int4_from_the_config(tmp_path):
    """`quantize: {weights: int8}` compiles the Llama example with MatMulNBits; the artifact
    matches the reference backend's run of the same codes, and int8 stays close to fp32."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import llama
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model, inputs, dynamic = llama.build()
    ids = torch.randint(0, int(inputs[0].max()) + 1, (1, 11))
    with torch.no_grad():
        eager = model(ids).numpy()
    for kind, close in (("int8", 2e-2), ("int4", None)):
        config = {"quantize": {"weights": kind, "group_size": 32}}
        ort = compiler.compile(model, inputs, out=tmp_path / f"{kind}.dz", config=config,
                               dynamic_shapes=dynamic)
        ref = compiler.compile(model, inputs, out=tmp_path / f"{kind}_ref.dz", config=config,
                               dynamic_shapes=dynamic, backend="reference")
        assert "MatMulNBits" in (ort / "backend" / "model.onnx").read_bytes().decode("latin-1")
        got = runtime.load(ort)(ids)[0]
        np.testing.assert_allclose(got, runtime.load(ref)(ids)[0], rtol=1e-5, atol=1e-5)
        if close is not None:
            assert np.abs(got - eager).max() < close


def test_half_scales_are_stored_before_the_codes_round_against_them():
    """float16 scales: the codes are the best ones for the stored (rounded) scale, so each
    weight is within half a step of it (the extreme within a float16 rounding of its step);
    a scale below float16's range keeps its smallest step; one beyond it is refused."""
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    w = w * torch.tensor([1.0, 1e-3, 3e-8, 0.0])[:, None]
    codes, scales = quantize_half_scales(w, 4, 32)
    assert scales.dtype == torch.float16 and bool((scales != 0).all())
    values = torch.stack([codes & 15, codes >> 4], -1).reshape(4, 2, 32).float() - 8
    stored = scales.float().reshape(4, 2, 1)
    want = torch.round(w.reshape(4, 2, 32) / stored).clamp(-8, 7)
    assert torch.equal(values, want)  # rounded against the stored scale
    step = stored.abs().expand(4, 2, 32).reshape(4, 64)
    back = (values * stored).reshape(4, 64)
    assert bool(((back - w).abs() <= step).all())
    assert scales[4:6].float().abs().min() == 2.0 ** -24  # 3e-8 / 8 is below float16's steps
    with pytest.raises(DayzeroError, match="beyond what float16 scales hold"):
        quantize_half_scales(torch.full((1, 32), 1e6), 4, 32)
