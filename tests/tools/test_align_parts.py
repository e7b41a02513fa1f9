"""The pieces of `dayzero align`: metrics, thresholds, precisions, layers, value matching."""

from __future__ import annotations

import math

import numpy as np

from compiler.ir import parse_ir
from compiler.tools.align import value_precisions
from compiler.tools.correspond import correspond
from compiler.tools.layers import layer_labels
from compiler.tools.metrics import compare, cosine
from compiler.tools.thresholds import EXACT, THRESHOLDS, Threshold, narrowest, threshold_for

LOOSE = Threshold(1e-3, 1e-2, 0.999)


def test_metrics_of_a_small_difference():
    ref = np.array([1.0, -2.0, 0.0, 4.0], dtype=np.float32)
    got = ref + np.array([0.0, 1e-3, 2e-4, -4e-3], dtype=np.float32)
    e = compare(got, ref, LOOSE)
    assert math.isclose(e.max_abs, 4e-3, rel_tol=1e-3)
    # relative to |ref| + atol: the zero reference gives 2e-4 / 1e-3, not infinity
    assert math.isclose(e.max_rel, 2e-4 / 1e-3, rel_tol=1e-3)
    # allclose ratio: the zero reference's 2e-4 / (1e-3 + 0) is worse than 4e-3 / (1e-3 + 4e-2)
    assert math.isclose(e.worst, 0.2, rel_tol=1e-3)
    assert e.mismatched == 0 and e.size == 4 and e.passes(LOOSE)
    assert 0.99999 < e.cosine < 1.0


def test_metrics_fail_outside_the_bound_and_count_elements():
    ref = np.zeros(10, dtype=np.float32) + 1.0
    got = ref.copy()
    got[3] += 0.1
    e = compare(got, ref, LOOSE)
    assert e.mismatched == 1 and not e.passes(LOOSE)
    assert math.isclose(e.worst, 0.1 / 0.011, rel_tol=1e-5)


def test_nan_on_both_sides_is_equal_on_one_side_is_infinite():
    ref = np.array([np.nan, 1.0, np.inf])
    assert compare(ref.copy(), ref, LOOSE).max_abs == 0.0
    e = compare(np.array([np.nan, np.nan, np.inf]), ref, LOOSE)
    assert e.max_abs == math.inf and not e.passes(LOOSE)


def test_integers_must_match_exactly():
    ref = np.array([1, 2, 3])
    assert compare(ref.copy(), ref, EXACT).passes(EXACT)
    e = compare(np.array([1, 2, 4]), ref, EXACT)
    assert e.mismatched == 1 and not e.passes(EXACT)
    assert compare(np.array([True, False]), np.array([True, True]), EXACT).mismatched == 1


def test_cosine_ignored_for_values_within_atol():
    # direction of ~0 values is noise: within atol passes whatever the cosine
    ref = np.array([1e-6, -1e-6])
    e = compare(-ref, ref, LOOSE)
    assert e.cosine < 0 and e.passes(LOOSE)
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0 and cosine(np.zeros(3), np.ones(3)) == 0.0


def test_threshold_table_by_class_and_dtype():
    assert threshold_for("softmax", "reduction", "f32") == THRESHOLDS["strict"]["f32"]
    assert threshold_for("rms_norm", "normalization", "f16") == THRESHOLDS["strict"]["f16"]
    assert threshold_for("scaled_dot_product_attention", "attention", "bf16") == \
        THRESHOLDS["strict"]["bf16"]
    assert threshold_for("linear", "matmul", "f16") == THRESHOLDS["default"]["f16"]
    assert threshold_for("add", "elementwise", "i64") == EXACT
    assert threshold_for("eq", "elementwise", "bool") == EXACT
    # stricter really is stricter, everywhere
    for dtype, strict in THRESHOLDS["strict"].items():
        loose = THRESHOLDS["default"][dtype]
        assert strict.atol < loose.atol and strict.rtol < loose.rtol
        assert strict.cosine > loose.cosine
    override = threshold_for("linear", "matmul", "f32", atol=0.5, rtol=0.25)
    assert (override.atol, override.rtol) == (0.5, 0.25)
    assert threshold_for("linear", "matmul", "f8e4m3").atol > THRESHOLDS["default"]["bf16"].atol
    assert narrowest(["f32", "i64", "f16", "bf16"]) == "bf16" and narrowest(["i64"]) is None


PRECISION = """graph g {
  input %x: f32[2, 4]
  weight @w: f16[4, 4]
  weight @g: f32[4]
  input %ids: i64[2]
  %a: f32[2, 4] = rms_norm(%x, @g) {normalized_shape=[4], eps=1e-06}
  %h: f16[2, 4] = cast(%a) {dtype=f16}
  %y: f16[2, 4] = linear(%h, @w, _)
  %z: f32[2, 4] = cast(%y) {dtype=f32}
  %n: f32[2, 4] = rms_norm(%z, @g) {normalized_shape=[4], eps=1e-06}
  %k: i64[2] = add(%ids, %ids)
  return %n, %k
}"""


def test_precision_is_the_narrowest_dtype_upstream():
    graph = parse_ir(PRECISION)
    precision = {v.name: precision for v in graph.values()
                 for key, precision in value_precisions(graph).items() if key == id(v)}
    assert precision["a"] == "f32" and precision["y"] == "f16"
    assert precision["n"] == "f16"  # an f32 norm of values that went through f16
    assert precision["k"] == "i64"


LAYERED = """graph g {
  input %x: f32[2, 4]
  weight @model.embed.weight: f32[4, 4]
  weight @model.layers.0.fc.weight: f32[4, 4]
  weight @model.layers.1.fc.weight: f32[4, 4]
  weight @model.vision.layers.0.fc.weight: f32[4, 4]
  weight @folded.model_layers_1_norm_f16: f32[4]
  %e: f32[2, 4] = linear(%x, @model.embed.weight, _)
  %a: f32[2, 4] = linear(%e, @model.layers.0.fc.weight, _)
  %b: f32[2, 4] = linear(%a, @model.layers.1.fc.weight, _)
  %c: f32[2, 4] = add(%b, %a)
  %v: f32[2, 4] = linear(%x, @model.vision.layers.0.fc.weight, _)
  %n: f32[2, 4] = rms_norm(%x, @folded.model_layers_1_norm_f16) {normalized_shape=[4], eps=1e-06}
  return %c, %v, %n
}"""


def test_layers_from_weight_names():
    labels = layer_labels(parse_ir(LAYERED))
    assert labels["e"] == "input"
    assert labels["a"] == "model.layers.0"  # two components would clash with vision's
    assert labels["b"] == labels["c"] == "model.layers.1"  # the latest layer upstream
    assert labels["v"] == "vision.layers.0"
    assert labels["n"] == labels["b"]  # a folded weight counts for its source's layer


REFERENCE = """graph g {
  input %x: f32[2, 8]
  weight @wq: f32[8, 8]
  weight @wk: f32[8, 8]
  weight @g: f32[8]
  %sq: f32[2, 8] = mul(%x, %x)
  %ms: f32[2, 1] = mean(%sq) {dims=[-1], keepdim=true}
  %r: f32[2, 1] = rsqrt(%ms)
  %nx: f32[2, 8] = mul(%x, %r)
  %norm: f32[2, 8] = mul(%nx, @g)
  %q: f32[2, 8] = linear(%norm, @wq, _)
  %k: f32[2, 8] = linear(%norm, @wk, _)
  %s: f32[2, 8] = add(%q, %k)
  %t: f32[2, 8] = tanh(%s)
  return %t
}"""

# rms_norm fused (taking over %norm's name), q/k merged into one linear and sliced, a cast
# around tanh, and the output renamed by the pass that cast it
COMPILED = """graph g {
  input %x: f32[2, 8]
  weight @wqk: f32[16, 8]
  weight @g: f32[8]
  %norm: f32[2, 8] = rms_norm(%x, @g) {normalized_shape=[8], eps=0.0, origin=["%sq mul", \
"%ms mean", "%r rsqrt", "%nx mul", "%norm mul"]}
  %qk: f32[2, 16] = linear(%norm, @wqk, _) {origin=["%q linear", "%k linear"]}
  %slice: f32[2, 8] = slice(%qk) {dim=1, start=0, end=8, step=1}
  %slice_1: f32[2, 8] = slice(%qk) {dim=1, start=8, end=16, step=1}
  %s: f32[2, 8] = add(%slice, %slice_1)
  %s_f16: f16[2, 8] = cast(%s) {dtype=f16}
  %t: f16[2, 8] = tanh(%s_f16)
  %t_f32: f32[2, 8] = cast(%t) {dtype=f32}
  return %t_f32
}"""


def test_values_match_across_fusion_merging_and_casts():
    ref, comp = parse_ir(REFERENCE), parse_ir(COMPILED)
    matches = correspond(comp, ref)
    found = {v.name: (matches[id(v)].ref.name, matches[id(v)].rule)
             for n in comp.nodes for v in n.outputs if id(v) in matches}
    assert found == {
        "norm": ("norm", "origin"),  # same name, other op: matched through its origin
        "slice": ("q", "reader"), "slice_1": ("k", "reader"),
        "s": ("s", "name"),
        "s_f16": ("s", "reader"),  # the cast tanh reads stands for what tanh read
        "t": ("t", "name"),
        "t_f32": ("t", "output"),
    }
    # the merged projection stands for no single reference value
    assert not any(v.name == "qk" and id(v) in matches for v in comp.values())


def test_a_graph_matches_itself_by_name():
    graph = parse_ir(COMPILED)
    matches = correspond(graph, graph)
    assert all(matches[id(v)].ref is v and matches[id(v)].rule == "name"
               for n in graph.nodes for v in n.outputs)
