"""The fused ops (compiler/ir/ops/fused.py): their reference semantics (their decompositions)
against independent torch formulas, the decompositions of the existing model-level ops against
their torch references, shape rules, text round trips, and lowering them back to primitives."""

from __future__ import annotations

from textwrap import dedent

import pytest
import torch
import torch.nn.functional as F

from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, TensorType, get_op, parse_ir, print_ir, verify
from compiler.ir.ops import ShapeError
from compiler.ir.ops.fused import ACTIVATIONS, DECOMPOSITIONS, Emitter
from passes.fusion.decompose import decompose_unsupported
from tests.passes.fusion_util import fuse_text

GEN = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=GEN)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


TORCH_ACTIVATIONS = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu,
                     "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
                     "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def test_every_fused_op_has_a_decomposition_and_kind_fused():
    fused = {"rotary_embedding", "fused_linear", "gated_mlp", "add_rms_norm", "add_layer_norm"}
    assert fused <= set(DECOMPOSITIONS)
    assert all(get_op(op).kind == "fused" for op in fused)
    assert set(TORCH_ACTIVATIONS) == set(ACTIVATIONS)


def test_rotary_embedding_reference():
    x, cos, sin = randn(1, 4, 5, 8), randn(1, 1, 5, 8), randn(1, 1, 5, 8)
    got = get_op("rotary_embedding").reference(x, cos, sin)
    torch.testing.assert_close(got, x * cos + rotate_half(x) * sin, rtol=0, atol=0)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_fused_linear_reference(activation, layout):
    x, w, b = randn(2, 3, 8), randn(6, 8), randn(6)
    weight = w if layout == "out_in" else w.T.contiguous()
    got = get_op("fused_linear").reference(x, weight, b, activation=activation,
                                           weight_layout=layout)
    want = TORCH_ACTIVATIONS[activation](F.linear(x, w, b))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh", "relu"])
def test_gated_mlp_reference(activation):
    x, wg, wu, wd = randn(2, 3, 8), randn(16, 8), randn(16, 8), randn(8, 16)
    bg, bu, bd = randn(16), randn(16), randn(8)
    got = get_op("gated_mlp").reference(x, wg, wu, wd, bg, bu, bd, activation=activation)
    act = TORCH_ACTIVATIONS[activation]
    want = F.linear(act(F.linear(x, wg, bg)) * F.linear(x, wu, bu), wd, bd)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    no_bias = get_op("gated_mlp").reference(x, wg, wu, wd, None, None, None,
                                            activation=activation)
    torch.testing.assert_close(no_bias, F.linear(act(F.linear(x, wg)) * F.linear(x, wu), wd))


def test_add_norm_references_return_norm_and_sum():
    x, r, w, b = randn(2, 5, 8), randn(2, 5, 8), randn(8), randn(8)
    norm, total = get_op("add_rms_norm").reference(x, r, w, normalized_shape=[8], eps=1e-6)
    torch.testing.assert_close(total, x + r, rtol=0, atol=0)
    torch.testing.assert_close(norm, F.rms_norm(x + r, [8], w, 1e-6))
    norm, total = get_op("add_layer_norm").reference(x, r, w, b, normalized_shape=[8],
                                                     eps=1e-5)
    torch.testing.assert_close(norm, F.layer_norm(x + r, [8], w, b, 1e-5))


def _decomposed(op: str, tensors: list, attrs: dict) -> list[torch.Tensor]:
    graph = Graph("d")
    values = [None if t is None else graph.add_input(
        f"in{i}", TensorType(DType.from_torch(t.dtype), tuple(t.shape)))
        for i, t in enumerate(tensors)]
    graph.outputs = DECOMPOSITIONS[op](Emitter(graph), values, get_op(op).complete_attrs(attrs))
    verify(graph)
    assert all(get_op(n.op).kind != "fused" for n in graph.nodes)
    return run_graph(graph, {}, [t for t in tensors if t is not None])


MASK_F = torch.zeros(5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -1e9)
SDPA = "scaled_dot_product_attention"
EXISTING = {
    "rms_norm": ("rms_norm", [randn(2, 5, 8), randn(8)], {"normalized_shape": [8], "eps": 1e-6}),
    "rms_norm_two_dims": ("rms_norm", [randn(2, 5, 8), None],
                          {"normalized_shape": [5, 8], "eps": 1e-5}),
    "layer_norm": ("layer_norm", [randn(2, 5, 8), randn(8), randn(8)], {"normalized_shape": [8]}),
    "gelu": ("gelu", [randn(3, 8)], {}),
    "gelu_tanh": ("gelu", [randn(3, 8)], {"approximate": "tanh"}),
    "silu": ("silu", [randn(3, 8)], {}),
    "sdpa_float_mask": (SDPA, [randn(1, 2, 5, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 3), MASK_F],
                        {"scale": 0.3}),
    "sdpa_bool_mask": (SDPA, [randn(1, 2, 5, 4), randn(1, 2, 6, 4), randn(1, 2, 6, 4),
                              torch.rand(1, 1, 5, 6, generator=GEN) < 0.8], {}),
    "sdpa_causal_gqa": (SDPA, [randn(1, 4, 5, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 4), None],
                        {"is_causal": True, "enable_gqa": True}),
    "sdpa_window_softcap": (SDPA, [randn(1, 4, 7, 4), randn(1, 2, 7, 4), randn(1, 2, 7, 4), None],
                            {"is_causal": True, "enable_gqa": True, "window": 3,
                             "softcap": 2.0}),
    "sdpa_softcap_mask": (SDPA, [randn(1, 2, 5, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 3),
                                 MASK_F], {"scale": 0.3, "softcap": 1.5}),
    "mha_window": ("multi_head_attention", [randn(1, 7, 16), randn(1, 7, 8), randn(1, 7, 8), None,
                                            None, None],
                   {"num_heads": 4, "kv_num_heads": 2, "is_causal": True, "window": 2}),
}


def _sliding_softcapped(q, k, v, scale, window, softcap):
    """transformers' eager attention: scores * scale, softcap * tanh(scores / softcap), then the
    sliding-window causal mask (kv_idx > q_idx - window and kv_idx <= q_idx) as -inf."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    i = torch.arange(q.shape[-2])[:, None]
    j = torch.arange(k.shape[-2])[None, :]
    keep = (j <= i) & (j > i - window) if window is not None else j <= i
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("window, softcap", [(1, None), (3, None), (4, 50.0), (None, 0.5),
                                             (20, None)])
def test_window_and_softcap_reference_matches_transformers_semantics(window, softcap):
    q, k, v = randn(1, 2, 9, 4), randn(1, 2, 9, 4), randn(1, 2, 9, 4)
    got = get_op(SDPA).reference(q, k, v, None, is_causal=True, scale=0.5, enable_gqa=False,
                                 window=window, softcap=softcap)
    torch.testing.assert_close(got, _sliding_softcapped(q, k, v, 0.5, window, softcap))


def test_window_hides_a_nan_key_before_it():
    """A NaN key that the window hides never reaches a row (masked_fill, not an added -inf)."""
    q, k, v = randn(1, 1, 6, 4), randn(1, 1, 6, 4), randn(1, 1, 6, 4)
    k[..., 0, :] = float("nan")
    got = get_op(SDPA).reference(q, k, v, None, is_causal=True, scale=None, enable_gqa=False,
                                 window=2, softcap=None)
    assert got[..., :2, :].isnan().all() and not got[..., 2:, :].isnan().any()


@pytest.mark.parametrize("case", sorted(EXISTING))
def test_decompositions_of_existing_ops_match_their_torch_reference(case):
    op, tensors, attrs = EXISTING[case]
    want = get_op(op).reference(*tensors, **get_op(op).complete_attrs(attrs))
    (got,) = _decomposed(op, tensors, attrs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("op,types,attrs,message", [
    ("rotary_embedding", [(1, 2, 3, 7)] * 3, {}, "must be even"),
    ("rotary_embedding", [(1, 2, 3, 8), (1, 1, 4, 8), (1, 1, 3, 8)], {}, "cannot broadcast"),
    ("fused_linear", [(2, 8), (8, 6), None], {"weight_layout": "oi"}, "weight_layout"),
    ("fused_linear", [(2, 8), (6, 8), None], {"weight_layout": "in_out"}, "in_out weight"),
    ("fused_linear", [(2, 8), (6, 8), None], {"activation": "swish"}, "unknown activation"),
    ("gated_mlp", [(2, 8), (16, 8), (12, 8), (8, 16), None, None, None], {}, "differ"),
    ("add_rms_norm", [(2, 8), (1, 8), None], {"normalized_shape": [8]}, "one type"),
    ("add_layer_norm", [(2, 8), (2, 8), (4,), None], {"normalized_shape": [8]}, "parameter"),
])
def test_fused_shape_rules_reject_bad_operands(op, types, attrs, message):
    opdef = get_op(op)
    operand_types = [None if t is None else TensorType(DType.f32, t) for t in types]
    with pytest.raises(ShapeError, match=message):
        opdef.infer(operand_types, opdef.complete_attrs(dict(attrs)))


ROUND_TRIP = """\
graph main {
  symbol s0 in [1, 64]
  input %x: f32[1, 4, s0, 16]
  input %c: f32[1, 1, s0, 16]
  input %h: f32[s0, 64]
  weight @w: f32[64]
  weight @wg: f32[128, 64]
  weight @wu: f32[128, 64]
  weight @wd: f32[64, 128]
  weight @fc: f32[64, 32]
  %r: f32[1, 4, s0, 16] = rotary_embedding(%x, %c, %c) {origin=["%a mul", "%b add"]} loc("m.py:1")
  %n: f32[s0, 64], %s: f32[s0, 64] = add_rms_norm(%h, %h, @w) {normalized_shape=[64], eps=1e-06}
  %m: f32[s0, 64] = gated_mlp(%n, @wg, @wu, @wd, _, _, _) {activation="silu"}
  %l: f32[s0, 64], %t: f32[s0, 64] = add_layer_norm(%m, %s, _, @w) {normalized_shape=[64], eps=0.1}
  %f: f32[s0, 32] = fused_linear(%l, @fc, _) {activation="gelu_tanh", weight_layout="in_out"}
  %e: f32[s0, 32] = exp(%f) {fusion_group=0}
  %g: f32[s0, 32] = neg(%e) {origin=["%q exp"], fusion_group=0}
  return %r, %g, %t
}
"""


def test_fused_ops_and_meta_attributes_round_trip(roundtrip):
    graph = roundtrip(ROUND_TRIP)
    assert graph.nodes[0].attrs["origin"] == ["%a mul", "%b add"]
    assert graph.nodes[-1].attrs == {"origin": ["%q exp"], "fusion_group": 0}


def test_meta_attributes_never_reach_references_and_unknown_ones_still_fail():
    x = randn(4)
    assert torch.equal(get_op("exp").reference(x, origin=["%a exp"], fusion_group=3), x.exp())
    with pytest.raises(ShapeError, match="no attribute"):
        get_op("exp").complete_attrs({"groupp": 1})


def test_decompose_fused_pass_restores_primitives_and_keeps_values():
    graph, _ = fuse_text(ROUND_TRIP, "decompose_fused")
    assert not [n for n in graph.nodes if get_op(n.op).kind == "fused"]
    assert {"rms_norm", "layer_norm", "gelu", "silu"} <= {n.op for n in graph.nodes}
    (concat,) = [n for n in graph.nodes if n.op == "concat"]
    assert concat.loc == "m.py:1" and "origin" not in concat.attrs  # moves data, computes nothing
    neg = next(n for n in graph.nodes if n.op == "neg" and n.loc == "m.py:1")
    assert neg.attrs["origin"] == ["%a mul", "%b add"]
    everything, _ = fuse_text(ROUND_TRIP, "decompose_fused{ops=all}")
    assert not {"rms_norm", "layer_norm", "gelu", "silu"} & {n.op for n in everything.nodes}
    original = parse_ir(ROUND_TRIP)
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(1, 4, 3, 16, generator=gen), torch.randn(1, 1, 3, 16, generator=gen),
              torch.randn(3, 64, generator=gen)]
    weights = {n: torch.randn([int(d) for d in v.shape], generator=gen) * 0.1
               for n, v in original.weights.items()}
    want = run_graph(original, weights, inputs)
    for lowered in (graph, everything):
        for g, w in zip(run_graph(lowered, weights, inputs), want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_decompose_unsupported_lowers_only_what_a_backend_lacks():
    graph = parse_ir(ROUND_TRIP)
    supported = {"add_rms_norm", "rms_norm"}
    decompose_unsupported(graph, lambda n: get_op(n.op).kind != "fused" or n.op in supported)
    verify(graph)
    ops = {n.op for n in graph.nodes}
    assert "add_rms_norm" in ops and not ops & {"gated_mlp", "rotary_embedding", "fused_linear"}
    assert "layer_norm" in ops  # supported by default: only fused ops were refused


def test_decompose_leaves_nodes_it_cannot_build():
    text = dedent("""\
        graph main {
          symbol s0 in [1, 8]
          input %q: f32[1, 2, 3, s0]
          %a: f32[1, 2, 3, s0] = scaled_dot_product_attention(%q, %q, %q, _)
          return %a
        }
        """)
    graph = parse_ir(text)
    before = print_ir(graph)
    assert decompose_unsupported(graph, lambda n: False) == []
    assert print_ir(graph) == before

