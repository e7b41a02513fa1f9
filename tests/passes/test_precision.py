"""The precision pass: IR text in and out, numerics against torch, weight storage, options."""

from __future__ import annotations

from textwrap import dedent

import pytest
import torch
from torch import nn

import compiler
from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.ir import DType, print_ir
from compiler.ir.weights import WeightOverflowError
from passes import format_pipeline, parse_pipeline

LM = """
    graph main {
      symbol s0 in [1, 16]
      input %ids: i64[1, s0]
      weight @emb: f32[32, 8]
      weight @w: f32[16, 8]
      weight @g: f32[8]
      weight @inv: f32[4]
      %e: f32[1, s0, 8] = embedding(@emb, %ids)
      %n: f32[1, s0, 8] = rms_norm(%e, @g) {normalized_shape=[8], eps=1e-06}
      %h: f32[1, s0, 16] = linear(%n, @w, _)
      %sm: f32[1, s0, 16] = softmax(%h) {dim=-1}
      %pos: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
      %pf: f32[s0] = cast(%pos) {dtype=f32}
      %pr: f32[s0, 1] = reshape(%pf) {shape=[s0, 1]}
      %ang: f32[s0, 4] = mul(%pr, @inv)
      %c: f32[s0, 4] = cos(%ang)
      %two: f32[] = constant() {value=2.0, dtype=f32}
      %sc: f32[1, s0, 16] = mul(%sm, %two)
      return %sc, %c
    }
"""


def test_bf16_activations_keep_norm_softmax_and_position_math_in_fp32(run_pass):
    result = run_pass(LM, "precision{weight_dtype=bf16,activation_dtype=bf16}")
    assert result.changed is True
    assert print_ir(result.graph) == dedent("""\
        graph main {
          symbol s0 in [1, 16]
          input %ids: i64[1, s0]
          weight @emb: bf16[32, 8]
          weight @w: bf16[16, 8]
          weight @g: f32[8]
          weight @inv: f32[4]
          %e: bf16[1, s0, 8] = embedding(@emb, %ids)
          %e_f32: f32[1, s0, 8] = cast(%e) {dtype=f32}
          %n: f32[1, s0, 8] = rms_norm(%e_f32, @g) {normalized_shape=[8], eps=1e-06}
          %n_bf16: bf16[1, s0, 8] = cast(%n) {dtype=bf16}
          %h: bf16[1, s0, 16] = linear(%n_bf16, @w, _)
          %h_f32: f32[1, s0, 16] = cast(%h) {dtype=f32}
          %sm: f32[1, s0, 16] = softmax(%h_f32) {dim=-1}
          %pos: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
          %pf: f32[s0] = cast(%pos) {dtype=f32}
          %pr: f32[s0, 1] = reshape(%pf) {shape=[s0, 1]}
          %ang: f32[s0, 4] = mul(%pr, @inv)
          %c: f32[s0, 4] = cos(%ang)
          %two: f32[] = constant() {value=2.0, dtype=f32}
          %sc: f32[1, s0, 16] = mul(%sm, %two)
          return %sc, %c
        }
        """)
    assert run_pass(print_ir(result.graph), "precision").changed is False


def test_without_kept_ops_softmax_runs_low_and_outputs_can_stay_low(run_pass):
    result = run_pass(LM, "precision{weight_dtype=bf16,activation_dtype=bf16,keep_fp32=none,"
                          "cast_outputs=false}")
    text = print_ir(result.graph)
    assert "%sm: bf16[1, s0, 16] = softmax(%h)" in text
    assert "%n: bf16[1, s0, 8] = rms_norm(%e, @g)" in text
    assert "weight @g: bf16[8]" in text  # low-precision code reads it now
    assert "%sc: bf16[1, s0, 16] = mul(%sm, %two_bf16)" in text  # scalars follow the data
    assert "%c: f32[s0, 4] = cos(%ang)" in text  # position math never changes


def test_outputs_keep_their_dtype_and_name(run_pass):
    result = run_pass(LM, "precision{weight_dtype=bf16,activation_dtype=bf16,keep_fp32=none}")
    graph = result.graph
    assert [(v.name, v.type.dtype) for v in graph.outputs] == [("sc", DType.f32), ("c", DType.f32)]
    assert graph.outputs[0].producer.op == "cast"


MLP = """
    graph main {
      input %x: f32[2, 8]
      weight @w1: f32[16, 8]
      weight @b1: f32[16]
      weight @w2: f32[4, 16]
      %h: f32[2, 16] = linear(%x, @w1, @b1)
      %a: f32[2, 16] = relu(%h)
      %y: f32[2, 4] = linear(%a, @w2, _)
      return %y
    }
"""


def test_weight_only_bf16_stores_bf16_and_casts_at_use(run_pass):
    w = {"w1": torch.randn(16, 8), "b1": torch.randn(16), "w2": torch.randn(4, 16)}
    result = run_pass(MLP, "precision{weight_dtype=bf16}", dict(w))
    graph = result.graph
    assert {n: v.type.dtype for n, v in graph.weights.items()} == {
        "w1": DType.bf16, "b1": DType.bf16, "w2": DType.bf16}
    assert all(graph.weight_data[n].dtype == torch.bfloat16 for n in w)
    assert "%h: f32[2, 16] = linear(%x, %w1_f32, %b1_f32)" in print_ir(graph)
    x = torch.randn(2, 8)
    (out,) = run_graph(graph, graph.weight_data, [x])
    rounded = {n: t.to(torch.bfloat16).float() for n, t in w.items()}
    ref = torch.relu(x @ rounded["w1"].T + rounded["b1"]) @ rounded["w2"].T
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_fp32_weights_with_bf16_activations_are_stored_narrow(run_pass):
    """A cast of a constant would be folded anyway; storing it narrow keeps memory bounded."""
    result = run_pass(MLP, "precision{activation_dtype=bf16}",
                      {"w1": torch.randn(16, 8), "b1": torch.randn(16), "w2": torch.randn(4, 16)})
    assert {v.type.dtype for v in result.graph.weights.values()} == {DType.bf16}
    assert "cast(%w" not in print_ir(result.graph)


def test_fp32_pair_is_a_no_op(run_pass):
    result = run_pass(MLP, "precision")
    assert result.changed is False


def test_overflowing_weight_is_named(run_pass):
    weights = {"w1": torch.full((16, 8), 1e5), "b1": torch.zeros(16), "w2": torch.ones(4, 16)}
    with pytest.raises(WeightOverflowError, match="weight 'w1' does not fit f16") as info:
        run_pass(MLP, "precision{weight_dtype=fp16,activation_dtype=fp16}", weights)
    assert "128 finite value(s)" in str(info.value) and "100000" in str(info.value)


def test_bad_keep_category_names_the_option():
    with pytest.raises(DayzeroError, match="keep_fp32.*'norms'"):
        parse_pipeline("precision{keep_fp32=norms}")


def test_pipeline_string_round_trips():
    text = "precision{weight_dtype=bf16,activation_dtype=fp16,keep_fp32=norm+softmax}"
    assert format_pipeline(parse_pipeline(text)) == text


class Block(nn.Module):
    """Embedding, layer norm, attention-like softmax and a GELU MLP: every rule at once."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.norm = nn.LayerNorm(32)
        self.q = nn.Linear(32, 32)
        self.k = nn.Linear(32, 32)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)

    def forward(self, ids):
        x = self.emb(ids)
        h = self.norm(x)
        att = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) / 32 ** 0.5, dim=-1)
        x = x + att @ h
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


@pytest.mark.parametrize("dtype,tol", [("bf16", 3e-2), ("fp16", 4e-3)])
def test_low_precision_graph_tracks_the_fp32_model(dtype, tol):
    torch.manual_seed(0)
    model = Block().eval()
    ids = torch.randint(0, 50, (2, 7))
    graph = compiler.export(model, (ids,))
    (pass_,) = parse_pipeline(f"precision{{weight_dtype={dtype},activation_dtype={dtype}}}")
    low = pass_.run(graph).graph
    assert {op for op in (n.op for n in low.nodes)} >= {"cast"}
    low_dtype = DType.bf16 if dtype == "bf16" else DType.f16
    assert any(n.op == "linear" and n.outputs[0].type.dtype == low_dtype for n in low.nodes)
    assert all(n.outputs[0].type.dtype == DType.f32 for n in low.nodes if n.op == "softmax")
    (out,) = run_graph(low, low.weight_data, [ids])
    with torch.no_grad():
        ref = model(ids)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=tol * ref.abs().max().item(), rtol=0)


def test_driver_runs_the_pass_from_the_precision_config(tmp_path):
    import runtime

    torch.manual_seed(0)
    model = Block().eval()
    ids = torch.randint(0, 50, (1, 5))
    out = compiler.compile(model, (ids,), out=tmp_path / "m.dz", backend="reference",
                           config={"precision": {"weight_dtype": "bf16",
                                                 "activation_dtype": "bf16"}})
    m = runtime.load(out)
    assert m.manifest["pipeline"].startswith(
        "precision{weight_dtype=bf16,activation_dtype=bf16},")
    with torch.no_grad():
        ref = model(ids).numpy()
    got = m(ids.numpy())[0]
    assert got.dtype.name == "float32"
    assert abs(got - ref).max() <= 3e-2 * abs(ref).max()


@pytest.mark.parametrize("key,value", [("weight_dtype", "fp8"), ("kv_cache_dtype", "bf16")])
def test_driver_still_refuses_what_it_cannot_do(tmp_path, key, value):
    with pytest.raises(DayzeroError, match=f"precision.{key}: {value}' is valid but not"):
        compiler.compile(Block(), (torch.zeros(1, 3, dtype=torch.long),), out=tmp_path / "m.dz",
                         backend="reference", config={"precision": {key: value}})
