"""The .dzir text form: print -> parse -> print is identical, and bad text fails with a clear error.

Every op in the op table gets a graph of its own (from a small table of example operands and
attributes); hand-written texts pin the exact canonical form of symbolic dims, floats, strings,
quoted names, absent operands, multi-output ops and locs; hypothesis builds random elementwise
graphs with arbitrary names and locs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from compiler.errors import IRParseError
from compiler.ir import OPS, DType, Graph, TensorType, parse_ir, print_ir, symbol, verify
from compiler.ir.ops import REQUIRED

S0 = symbol("s0")


@dataclass(frozen=True)
class W:
    """An operand declared as a weight (with a dotted name) rather than a graph input."""

    type: TensorType


def f32(*shape) -> TensorType:
    return TensorType(DType.f32, shape)


def i64(*shape) -> TensorType:
    return TensorType(DType.i64, shape)


def b(*shape) -> TensorType:
    return TensorType(DType.bool, shape)


# op -> (operands: TensorType input | W weight | None absent, attrs). Ops with a plain signature
# and no required attributes that are missing here get a generic example (see _example).
OP_EXAMPLES = {
    "cast": ([f32(S0, 4)], {"dtype": DType.f16}),
    "clamp": ([f32(S0, 4)], {"min": -1.0, "max": 6.0}),
    "gelu": ([f32(S0, 4)], {"approximate": "tanh"}),
    "leaky_relu": ([f32(S0, 4)], {"negative_slope": 0.1}),
    "softplus": ([f32(S0, 4)], {"beta": 2.0, "threshold": 15.0}),
    "elu": ([f32(S0, 4)], {"alpha": 0.5}),
    "div": ([f32(S0, 4), f32()], {"rounding_mode": "floor"}),
    "where": ([b(S0, 1), f32(S0, 4), f32()], {}),
    "matmul": ([f32(2, S0, 8), f32(8, 3)], {}),
    "linear": ([f32(S0, 8), W(f32(4, 8)), None], {}),
    "layer_norm": ([f32(S0, 8), W(f32(8)), W(f32(8))], {"normalized_shape": [8], "eps": 1e-05}),
    "rms_norm": ([f32(S0, 8), W(f32(8))], {"normalized_shape": [8], "eps": 1e-06}),
    "group_norm": ([f32(2, 4, S0), None, None], {"groups": 2}),
    "batch_norm": ([f32(2, 4, S0), W(f32(4)), W(f32(4)), W(f32(4)), W(f32(4))], {"eps": 0.001}),
    "embedding": ([W(f32(256, 8)), i64(1, S0)], {}),
    "conv": ([f32(1, 3, S0 + 6, 8), W(f32(4, 3, 3, 3)), W(f32(4))],
             {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1]}),
    "max_pool": ([f32(1, 3, 8, 8)], {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0],
                                     "dilation": [1, 1], "ceil_mode": True}),
    "avg_pool": ([f32(1, 3, S0, 8)], {"kernel": [3, 3], "stride": [1, 1], "padding": [1, 1],
                                      "divisor_override": 4}),
    "adaptive_avg_pool": ([f32(1, 3, S0, 8)], {"output_size": [1, 1]}),
    "scaled_dot_product_attention": (
        [f32(1, 4, S0, 16), f32(1, 2, S0, 16), f32(1, 2, S0, 16), b(S0, S0)],
        {"scale": 0.25, "enable_gqa": True}),
    "multi_head_attention": (
        [f32(1, S0, 32), f32(1, S0, 16), f32(1, S0, 16), f32(1, 1, S0, 8), f32(1, 1, S0, 8),
         None], {"num_heads": 4, "kv_num_heads": 2, "is_causal": True, "window": 4,
                 "softcap": 50.0}),
    "latent_attention": ([f32(1, 4, S0, 24), f32(1, 1, S0, 16), f32(1, 1, S0, 8), W(f32(80, 16)),
                          None], {"num_heads": 4, "nope_head_dim": 16, "v_head_dim": 4,
                                  "is_causal": True, "scale": 0.25}),
    "quantized_moe": ([f32(S0, 64), f32(S0, 4), W(TensorType(DType.u8, (4, 64, 2, 16))),
                       W(f32(4, 64, 2)), W(TensorType(DType.u8, (4, 64, 1, 16))), W(f32(4, 64, 1)),
                       None, W(f32(4, 64)), W(f32(4))],
                      {"bits": 4, "group_size": 32, "top_k": 2, "routing": "sigmoid_topk",
                       "normalize": True, "n_group": 2, "topk_group": 1, "group_top": 2}),
    "quantized_linear": ([f32(S0, 64), W(TensorType(DType.u8, (4, 2, 16))), W(f32(8)), None],
                         {"bits": 4, "group_size": 32, "in_features": 64,
                          "activations": "int8"}),
    "paged_attention": (
        [f32(1, S0, 32), f32(1, S0, 16), f32(1, S0, 16), f32(1, 1, S0, 8), f32(1, 1, S0, 8),
         TensorType(DType.i8, (40, 2, 8)), TensorType(DType.i8, (40, 2, 8)), i64(2, 12), i64(S0),
         i64(S0), f32(40, 2), f32(40, 2)],
        {"num_heads": 4, "kv_num_heads": 2, "window": 4, "softcap": 30.0}),
    "paged_latent_attention": (
        [f32(1, 4, S0, 24), f32(1, 1, S0, 16), f32(1, 1, S0, 8), W(f32(80, 16)),
         TensorType(DType.i8, (40, 1, 16)), TensorType(DType.i8, (40, 1, 8)), i64(2, 12), i64(S0),
         i64(S0), f32(40, 1), f32(40, 1)],
        {"num_heads": 4, "nope_head_dim": 16, "v_head_dim": 4, "scale": 0.25, "window": 4,
         "softcap": 30.0}),
    "sum": ([f32(S0, 4)], {"dims": [1], "keepdim": True}),
    "mean": ([f32(S0, 4)], {"dims": [-1]}),
    "var": ([f32(S0, 4)], {"dims": [0], "correction": 0}),
    "any": ([b(S0, 4)], {"dims": [0, 1]}),
    "argmax": ([f32(S0, 4)], {"dim": 1, "keepdim": True}),
    "softmax": ([f32(S0, 4)], {"dim": 0}),
    "cumsum": ([i64(S0, 4)], {"dim": 0}),
    "reshape": ([f32(S0, 4)], {"shape": [2 * S0, 2]}),
    "permute": ([f32(S0, 4, 2)], {"dims": [2, 0, 1]}),
    "expand": ([f32(S0, 1)], {"shape": [2, S0, 4]}),
    "slice": ([f32(2 * S0, 4)], {"dim": 0, "start": 1, "end": S0 + 1, "step": 2}),
    "select": ([f32(S0, 4)], {"dim": -1, "index": 0}),
    "concat": ([f32(S0, 4), f32(1, 4), f32(S0, 4)], {"dim": 0}),
    "gather": ([f32(S0, 4), i64(S0, 2)], {"dim": 1}),
    "index_select": ([f32(S0, 4), i64(3)], {"dim": 1}),
    "index": ([f32(S0, 4, 5), None, i64(2)], {}),
    "pad": ([f32(S0, 4)], {"pads": [1, 1, 0, 2], "value": float("-inf")}),
    "flip": ([f32(S0, 4)], {"dims": [0]}),
    "tril": ([f32(S0, S0)], {"diagonal": -1}),
    "repeat": ([f32(S0, 4)], {"repeats": [1, 2]}),
    "topk": ([f32(S0, 8)], {"k": 3, "dim": -1, "largest": False}),
    "fused_linear": ([f32(S0, 8), W(f32(8, 4)), W(f32(4))],
                     {"activation": "gelu_tanh", "weight_layout": "in_out"}),
    "gated_mlp": ([f32(S0, 8), W(f32(16, 8)), W(f32(16, 8)), W(f32(8, 16)), None, None, None],
                  {"activation": "silu"}),
    "add_rms_norm": ([f32(S0, 8), f32(S0, 8), W(f32(8))], {"normalized_shape": [8]}),
    "add_layer_norm": ([f32(S0, 8), f32(S0, 8), None, W(f32(8))], {"normalized_shape": [8]}),
    "shard": ([f32(S0, 8)], {"layout": "tp:S1"}),
    "all_reduce": ([f32(S0, 8)], {"axis": "tp", "ranks": [0, 1]}),
    "all_gather": ([f32(S0, 8)], {"axis": "tp", "dim": -1, "ranks": [2, 3]}),
    "reduce_scatter": ([f32(S0, 8)], {"axis": "tp", "dim": 1}),
    "send": ([f32(S0, 8)], {"peer": 1, "tag": 7}),
    "expert_dispatch": ([f32(S0, 8), i64(S0, 2)],
                        {"axis": "ep", "experts": 4, "rows": "s0", "ranks": [0, 1]}),
    "expert_combine": ([f32(S0, 8), i64(2), f32(5, 2), i64(5, 2)],
                       {"axis": "ep", "experts": 8, "ranks": [2, 3]}),
    "recv": ([], {"shape": [S0, 8], "dtype": DType.bf16, "peer": 0, "tag": 7}),
    "constant": ([], {"value": 0.1, "dtype": DType.f32}),
    "full": ([], {"shape": [S0, sympy.Max(1, S0 - 3)], "value": -1, "dtype": DType.i64}),
    "arange": ([], {"start": 0, "end": sympy.floor(S0 / 2), "step": 1}),
    "masked_scatter": ([f32(1, S0, 4), b(1, S0, 1), f32(3, 4)], {}),
    "sort": ([f32(S0, 8)], {"dim": 0, "descending": True}),
    "histc": ([f32(S0)], {"bins": 4, "min": 0.0, "max": 3.0}),
    "grouped_matmul": ([f32(S0, 8), W(f32(4, 8, 6)), TensorType(DType.i32, (4,))], {}),
    "index_put": ([i64(S0), i64(S0), i64(S0)], {"accumulate": True}),
    "moe": ([f32(S0, 8), f32(S0, 4), W(f32(4, 8, 12)), W(f32(4, 6, 8)), None, W(f32(4, 8)),
             W(f32(4)), W(f32(16, 8)), W(f32(16, 8)), W(f32(8, 16)), W(f32(1, 8))],
            {"top_k": 2, "routing": "sigmoid_topk", "normalize": True, "normalize_eps": 1e-20,
             "scale": 2.5, "n_group": 2, "topk_group": 1, "group_top": 2,
             "group_fill": float("-inf")}),
    "scatter": ([f32(S0, 4), i64(S0, 2), f32(S0, 2)], {"dim": 1, "reduce": "amax"}),
    "resize": ([f32(1, 3, S0, 8)], {"size": [16, 16], "mode": "bilinear", "align_corners": True}),
}

_GENERIC_DTYPE = {"bitwise": i64, "logical": b}


def _example(op: str):
    """The example for `op`: from the table, or generic for a plain signature."""
    if op in OP_EXAMPLES:
        return OP_EXAMPLES[op]
    opdef = OPS[op]
    if any(v is REQUIRED for v in opdef.attrs.values()) or any(
            p.endswith(("?", "*")) for p in opdef.inputs):
        raise AssertionError(f"op {op} needs an entry in OP_EXAMPLES")
    make = next((m for prefix, m in _GENERIC_DTYPE.items() if op.startswith(prefix)), f32)
    return [make(S0, 4) if i == 0 else make(4) for i in range(len(opdef.inputs))], {}


def op_graph(op: str) -> Graph:
    """One node of `op` over inputs and weights, with a loc; every output is returned."""
    operands, attrs = _example(op)
    g = Graph(f"test_{op}")
    g.symbols["s0"] = (1, 64)
    values = []
    for i, spec in enumerate(operands):
        if spec is None:
            values.append(None)
        elif isinstance(spec, W):
            values.append(g.add_weight(f"model.layers.0.{op}.p{i}", spec.type))
        else:
            values.append(g.add_input(f"in{i}", spec))
    node = g.add_node(op, values, attrs, loc=f"{op}.py:{len(op)} in forward")
    g.outputs = list(node.outputs)
    return g


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_round_trips(op, roundtrip):
    g = op_graph(op)
    parsed = roundtrip(g)
    [before], [after] = g.nodes, parsed.nodes
    assert after.op == op and after.loc == before.loc
    assert [v.type for v in after.outputs] == [v.type for v in before.outputs]
    assert [v and v.name for v in after.inputs] == [v and v.name for v in before.inputs]
    assert print_ir(parsed) == print_ir(g)
    for key, value in before.attrs.items():
        got = after.attrs[key]
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got)
        else:
            assert got == value and type(got) is type(value), key


def test_every_op_has_an_example():
    for op in OPS:
        _example(op)


# -- hand-written canonical texts ----------------------------------------------------------------
DECODER = r'''graph toy {
  symbol s0 in [2, 512]
  symbol s1 in [1, inf]
  input %input_ids: i64[1, s0]
  input %"attention mask": bool[s1, s0]
  weight @model.embed_tokens.weight: f32[256, 8]
  weight @"layers.0/q proj": f32[8, 8]
  weight @"\u00fcn\u00efcode": f32[8]
  %h: f32[1, s0, 8] = embedding(@model.embed_tokens.weight, %input_ids) loc("llama.py:12")
  %q: f32[1, s0, 8] = linear(%h, @"layers.0/q proj", _)
  %n: f32[1, s0, 8] = rms_norm(%q, @"\u00fcn\u00efcode") {normalized_shape=[8], eps=1e-05}
  %r: f32[1, s0, 2, 4] = reshape(%n) {shape=[1, s0, 2, 4]}
  %flat: f32[8*s0] = reshape(%n) {shape=[-1]}
  %twice: f32[2*s0, 8] = concat(%h.2d, %h.2d) {dim=0}
  %h.2d: f32[s0, 8] = select(%h) {dim=0, index=0}
  return %r
}
'''


def test_canonical_decoder_text_round_trips_exactly(roundtrip):
    # %twice reads %h.2d before its definition: the parser must reject that, see below
    text = DECODER.replace('  %twice: f32[2*s0, 8] = concat(%h.2d, %h.2d) {dim=0}\n', "")
    g = roundtrip(text)
    assert g.name == "toy"
    assert g.symbols == {"s0": (2, 512), "s1": (1, None)}
    assert [v.name for v in g.inputs] == ["input_ids", "attention mask"]
    assert list(g.weights) == ["model.embed_tokens.weight", "layers.0/q proj", "ünïcode"]
    assert g.nodes[0].loc == "llama.py:12"
    assert g.nodes[1].inputs[2] is None
    assert g.nodes[4].outputs[0].type.shape == (8 * S0,)


def test_use_before_definition_is_rejected():
    with pytest.raises(IRParseError, match=r"value '%h.2d' is used before it is defined") as e:
        parse_ir(DECODER)
    assert "line 14, column" in str(e.value)


SYMBOLIC = '''\
graph sym {
  symbol s0 in [1, 64]
  input %x: f32[s0, 2*s0]
  %a: f32[floor(s0/2), 2*s0] = slice(%x) {dim=0, start=0, end=floor(s0/2), step=1}
  %b: f32[s0, ceiling(s0/2)] = slice(%x) {dim=1, start=1, end=s0 + 1, step=2}
  %c: f32[s0 + 1, 2*s0] = pad(%x) {pads=[0, 0, 1, 0], value=0.0}
  %d: i64[Max(1, s0 - 3)] = arange() {start=0, end=Max(1, s0 - 3), step=1, dtype=i64}
  %e: f32[2*s0**2] = reshape(%x) {shape=[2*s0**2]}
  %f: f32[Mod(s0, 3), 2*s0] = slice(%x) {dim=0, start=0, end=Mod(s0, 3), step=1}
  %g: f32[2 - s0, 2*s0] = slice(%x) {dim=0, start=s0 - 1, end=1, step=1}
  %h: f32[Min(4, s0), 2*s0] = slice(%x) {dim=0, start=0, end=Min(4, s0), step=1}
  return %a, %b, %c, %d, %e, %f, %g, %h
}
'''


def test_symbolic_dims_and_expressions_round_trip(roundtrip):
    g = roundtrip(SYMBOLIC)
    shapes = [v.type.shape[0] for v in g.outputs]
    assert shapes == [sympy.floor(S0 / 2), S0, S0 + 1, sympy.Max(1, S0 - 3), 2 * S0**2,
                      sympy.Mod(S0, 3), 2 - S0, sympy.Min(4, S0)]


def test_equivalent_size_text_is_printed_canonically():
    text = SYMBOLIC.replace("f32[s0 + 1, 2*s0] = pad", "f32[1 + s0, s0*2] = pad")
    assert print_ir(parse_ir(text)) == SYMBOLIC


FLOATS = '''\
graph floats {
  %a: f32[] = constant() {value=1e-05, dtype=f32}
  %b: f32[] = constant() {value=-inf, dtype=f32}
  %c: f32[] = constant() {value=inf, dtype=f32}
  %d: f32[] = constant() {value=nan, dtype=f32}
  %e: f32[] = constant() {value=0.1, dtype=f32}
  %f: f32[] = constant() {value=-0.0, dtype=f32}
  %g: f64[] = constant() {value=1.7976931348623157e+308, dtype=f64}
  %h: f32[] = constant() {value=5e-324, dtype=f32}
  %i: i64[] = constant() {value=-9223372036854775807, dtype=i64}
  %j: bool[] = constant() {value=true, dtype=bool}
  %k: f32[] = constant() {value=3, dtype=f32}
  return %a, %b, %c, %d, %e, %f, %g, %h, %i, %j, %k
}
'''


def test_float_attributes_round_trip_exactly(roundtrip):
    g = roundtrip(FLOATS)
    values = [n.attrs["value"] for n in g.nodes]
    assert values[0] == 1e-05 and values[1] == -math.inf and values[2] == math.inf
    assert math.isnan(values[3]) and values[4] == 0.1
    assert values[5] == 0.0 and math.copysign(1, values[5]) == -1
    assert values[6] == 1.7976931348623157e308 and values[7] == 5e-324
    assert values[8] == -9223372036854775807 and values[9] is True
    assert values[10] == 3 and type(values[10]) is int


STRINGS = r'''graph "strings & quotes" {
  input %"x \"quoted\"": f32[4]
  input %"tab\there": f32[4]
  %"new\nline": f32[4] = gelu(%"x \"quoted\"") {approximate="tanh"} loc("m.py:1 \"q\" \\ back")
  %y: f32[4] = div(%"new\nline", %"tab\there") {rounding_mode="it's \"odd\""} loc("")
  %z: f32[4] = clamp(%y) {min=none, max=6.0} loc("\u00e9\u4e2d")
  return %z, %"new\nline"
}
'''


def test_strings_and_quoted_names_round_trip(roundtrip):
    g = roundtrip(STRINGS)
    assert g.name == "strings & quotes"
    assert [v.name for v in g.inputs] == ['x "quoted"', "tab\there"]
    assert g.nodes[0].outputs[0].name == "new\nline"
    assert g.nodes[0].loc == 'm.py:1 "q" \\ back'
    assert g.nodes[1].attrs["rounding_mode"] == "it's \"odd\""
    assert g.nodes[1].loc == ""
    assert g.nodes[2].loc == "é中" and g.nodes[2].attrs["min"] is None


MULTI = '''\
graph multi {
  symbol s0 in [1, 64]
  input %x: f32[s0, 8]
  input %idx: i64[2]
  %vals: f32[s0, 3], %ids: i64[s0, 3] = topk(%x) {k=3, dim=-1, largest=true, sorted=true}
  %picked: f32[s0, 2] = index(%vals, _, %idx)
  %q: f32[1, 2, s0, 4] = reshape(%x) {shape=[1, 2, s0, 4]}
  %o: f32[1, 2, s0, 4] = scaled_dot_product_attention(%q, %q, %q, _) \
{is_causal=true, scale=none, enable_gqa=false, window=2, softcap=none}
  return %ids, %picked, %o
}
'''.replace("\\\n", "")


def test_multi_output_and_absent_operands_round_trip(roundtrip):
    g = roundtrip(MULTI)
    topk = g.nodes[0]
    assert [v.name for v in topk.outputs] == ["vals", "ids"]
    assert g.nodes[1].inputs[0] is topk.outputs[0] and g.nodes[1].inputs[1] is None
    assert g.outputs[0] is topk.outputs[1]
    assert g.nodes[3].inputs[3] is None


def test_empty_graph_round_trips(roundtrip):
    g = roundtrip(print_ir(Graph("empty")))
    assert g.inputs == [] and g.nodes == [] and g.outputs == []


def test_comments_and_blank_lines_are_ignored():
    noisy = "# a bug report\n\n" + MULTI.replace("\n  %q", "\n\n  # the attention part\n  %q")
    assert print_ir(parse_ir(noisy)) == MULTI


def test_weight_and_value_names_live_apart(roundtrip):
    g = Graph()
    x = g.add_input("w", f32(4))
    w = g.add_weight("w", f32(4))
    g.outputs = [g.add_node("add", [x, w], names=["w.1"]).output, w]
    parsed = roundtrip(g)
    assert "%w.1: f32[4] = add(%w, @w)" in print_ir(parsed)
    assert parsed.outputs[1] is parsed.weights["w"]


def test_provenance_attributes_round_trip(roundtrip):
    g = Graph()
    x = g.add_input("x", f32(S0, 4))
    g.symbols["s0"] = (1, 8)
    node = g.add_node("silu", [x], {"origin": "%3 mul, %2 sigmoid", "fusion_group": 4})
    g.outputs = [node.output]
    parsed = roundtrip(g)
    assert parsed.nodes[0].attrs == {"origin": "%3 mul, %2 sigmoid", "fusion_group": 4}


# -- property-based round trip ------------------------------------------------------------------
NAMES = st.text(min_size=1, max_size=6)
SHAPES = [(S0, 4), (1, 4), (4,), (), (S0, 1)]
UNARY = ["neg", "exp", "tanh", "sigmoid", "relu", "sqrt", "abs", "silu"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]
COMPARE = ["eq", "lt", "ge"]
FLOATS_ANY = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def elementwise_graphs(draw) -> Graph:
    names = iter(draw(st.lists(NAMES, min_size=40, max_size=40, unique=True)))
    g = Graph(draw(st.sampled_from(["main", "f", "my model"])))
    g.symbols["s0"] = (1, draw(st.one_of(st.none(), st.integers(1, 10**6))))
    floats = [g.add_input(next(names), f32(*draw(st.sampled_from(SHAPES))))
              for _ in range(draw(st.integers(1, 3)))]
    bools = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "compare", "where", "constant", "clamp",
                                     "weight"]))
        loc = draw(st.one_of(st.none(), st.text(max_size=12)))
        name = [next(names)]
        pick = st.sampled_from(floats)
        if kind == "unary":
            node = g.add_node(draw(st.sampled_from(UNARY)), [draw(pick)], loc=loc, names=name)
        elif kind == "binary":
            node = g.add_node(draw(st.sampled_from(BINARY)), [draw(pick), draw(pick)], loc=loc,
                              names=name)
        elif kind == "compare":
            node = g.add_node(draw(st.sampled_from(COMPARE)), [draw(pick), draw(pick)], loc=loc,
                              names=name)
            bools.append(node.output)
            continue
        elif kind == "where" and bools:
            node = g.add_node("where", [draw(st.sampled_from(bools)), draw(pick), draw(pick)],
                              loc=loc, names=name)
        elif kind == "clamp":
            node = g.add_node("clamp", [draw(pick)], {"min": draw(FLOATS_ANY), "max": None},
                              loc=loc, names=name)
        elif kind == "weight":
            weight = g.add_weight(next(names), f32(*draw(st.sampled_from(SHAPES))))
            floats.append(weight)
            continue
        else:
            node = g.add_node("constant", [], {"value": draw(FLOATS_ANY), "dtype": DType.f32},
                              loc=loc, names=name)
        floats.append(node.output)
    g.outputs = draw(st.lists(st.sampled_from(floats + bools), min_size=1, max_size=4))
    return g


@given(elementwise_graphs())
def test_random_elementwise_graphs_round_trip(g):
    verify(g)
    text = print_ir(g)
    parsed = parse_ir(text)
    verify(parsed)
    assert print_ir(parsed) == text
    assert [n.op for n in parsed.nodes] == [n.op for n in g.nodes]
    assert [n.loc for n in parsed.nodes] == [n.loc for n in g.nodes]
    assert [v.name for v in parsed.values()] == [v.name for v in g.values()]
    assert [v.type for v in parsed.values()] == [v.type for v in g.values()]
    assert [v.name for v in parsed.outputs] == [v.name for v in g.outputs]
    for before, after in zip(g.nodes, parsed.nodes):
        for key, value in before.attrs.items():
            assert repr(after.attrs[key]) == repr(value), key  # exact, nan and -0.0 included


def _dims():
    leaves = st.one_of(st.integers(1, 9), st.just(S0), st.just(symbol("s1")))

    def combine(children):
        pair = st.tuples(children, children)
        return st.one_of(
            pair.map(lambda p: p[0] + p[1]),
            pair.map(lambda p: p[0] * p[1]),
            pair.map(lambda p: sympy.Max(p[0], p[1])),
            pair.map(lambda p: sympy.Min(p[0], p[1])),
            st.tuples(children, st.integers(2, 4)).map(
                lambda p: sympy.floor(sympy.Integer(1) * p[0] / p[1])),
            st.tuples(children, st.integers(2, 4)).map(
                lambda p: sympy.ceiling(sympy.Integer(1) * p[0] / p[1])),
            st.tuples(children, st.integers(2, 4)).map(lambda p: sympy.Mod(p[0], p[1])),
            children.map(lambda d: d**2),
        )

    return st.recursive(leaves, combine, max_leaves=5)


@given(st.lists(_dims(), min_size=1, max_size=3))
def test_random_size_expressions_round_trip(dims):
    g = Graph()
    g.symbols.update({"s0": (1, 64), "s1": (1, 8)})
    x = g.add_input("x", f32(*dims))
    g.outputs = [g.add_node("full", [], {"shape": dims, "value": 0.0, "dtype": DType.f32}).output,
                 x]
    text = print_ir(g)
    parsed = parse_ir(text)
    assert print_ir(parsed) == text
    assert parsed.inputs[0].type == g.inputs[0].type
    assert parsed.nodes[0].attrs["shape"] == list(g.nodes[0].attrs["shape"])


# -- malformed text ------------------------------------------------------------------------------
BASE = '''\
graph g {
  symbol s0 in [1, 64]
  input %x: f32[s0, 4]
  weight @w: f32[4]
  %y: f32[s0, 4] = BODY
  return %y
}
'''


def _parse_error(text: str) -> IRParseError:
    with pytest.raises(IRParseError) as info:
        parse_ir(text, source="bad.dzir")
    return info.value


@pytest.mark.parametrize("body, line, what, fix", [
    ("neg(%x", 5, r"syntax error: unexpected", r"expected one of: ',', '\)'"),
    ("neg(%x) loc(12)", 5, r"syntax error: unexpected '12'", "expected one of: STRING"),
    ("sum(%x) {dims=[1,], keepdim=false}", 5, r"syntax error: unexpected '\]'", "expected one of"),
    ("neg(%z)", 5, r"value '%z' is used before it is defined", "define it earlier"),
    ("neg(@v)", 5, r"weight '@v' is used before it is defined", "define it earlier"),
    ("frobnicate(%x)", 5, r"unknown op 'frobnicate'", "op set"),
    ("neg(%x, %x)", 5, r"neg takes inputs \(x\), got 2", None),
    ("neg(%x) {foo=1}", 5, r"neg has no attribute\(s\) \['foo'\]", None),
    ("reshape(%x)", 5, r"reshape needs attribute shape", None),
    ("cast(%x) {dtype=f16}", 5, r"result %y is declared f32\[s0, 4\] but cast gives f16\[s0, 4\]",
     r"declare it as f16\[s0, 4\]"),
    ("sum(%x) {dims=[1]}", 5, r"result %y is declared f32\[s0, 4\] but sum gives f32\[s0\]",
     r"declare it as f32\[s0\]"),
    ("cast(%x) {dtype=f33}", 5, r"attribute dtype: 'f33' is neither a dtype nor a declared size",
     "use a dtype"),
    ("reshape(%x) {shape=[bar(s0), 4]}", 5, r"unknown size function 'bar'", "use one of"),
    ("add(%x, @w) {}", 0, None, None),  # valid: the control case
])
def test_malformed_node(body, line, what, fix):
    text = BASE.replace("BODY", body)
    if what is None:
        parse_ir(text)
        return
    err = _parse_error(text)
    assert re.search(what, err.what), err.message()
    assert f"bad.dzir: line {line}, column" in err.where
    assert f"line {line}" in str(err)
    if fix is not None:
        assert re.search(fix, err.fix), err.message()


@pytest.mark.parametrize("old, new, line, what", [
    ("input %x: f32[s0, 4]", "input %x: f33[s0, 4]", 3, "unknown dtype 'f33'"),
    ("input %x: f32[s0, 4]", "input %x: f32[s1, 4]", 3, "size symbol 's1' is not declared"),
    ("  return %y", "  %y: f32[s0, 4] = neg(%x)\n  return %y", 6, "value '%y' is defined twice"),
    ("  return %y", "  %vals: f32[s0, 2] = topk(%x) {k=2}\n  return %y", 6,
     "topk has 2 results, 1 declared"),
    ("weight @w: f32[4]", "weight @w: f32[4]\n  weight @w: f32[4]", 5, "weight '@w' is declared"),
    ("input %x: f32[s0, 4]", "input %x: f32[s0, 4]\n  input %x: f32[4]", 4,
     "value '%x' is defined twice"),
    ("  return %y", "  return %nope", 6, "value '%nope' is used before it is defined"),
    ("symbol s0 in [1, 64]", "symbol s0 in [1, 64", 2, "syntax error: unexpected"),
    ("graph g {", "graph g", 1, "syntax error: unexpected"),
    ("  return %y\n}\n", "  return %y\n", 6, "unexpected end of input"),
    ("BODY", "reshape(%x) {shape=[Mod(s0, 0), 4]}", 5,
     "cannot evaluate size expression"),
])
def test_malformed_declaration(old, new, line, what):
    err = _parse_error(BASE.replace(old, new).replace("BODY", "neg(%x)"))
    assert what in err.what, err.message()
    assert f"line {line}" in err.where, err.message()


def test_syntax_error_points_at_the_column():
    err = _parse_error(BASE.replace("BODY", "neg(%x))"))
    lines = err.what.splitlines()
    assert lines[1].strip() == "%y: f32[s0, 4] = neg(%x))"
    assert lines[2].index("^") == lines[1].index("neg(%x))") + len("neg(%x)")
    assert err.where == "bad.dzir: line 5, column 27"
