"""multi_head_attention on ONNX Runtime: dayzero's CausalAttention, else GroupQueryAttention,
when they fit, the decomposition otherwise, and the equal-halves proof that lets the rotary
tables become the kernels' half cache."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from backends.onnxruntime.convert_heads import equal_halves
from backends.onnxruntime.fused import ContribFallbackWarning
from backends.onnxruntime.lower import lower_graph
from backends.onnxruntime.probe import installed_kernels
from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, parse_ir
from tests.backends.onnxruntime_cases import CASES
from tests.backends.onnxruntime_util import compile_graph, load

GQA = "com.microsoft.GroupQueryAttention"
MHA = "com.microsoft.MultiHeadAttention"
CAUSAL = "ai.dayzero.CausalAttention"


def _graph(case: str) -> Graph:
    g = Graph(case)
    g.symbols["s0"] = (1, 64)  # the artifact declares the symbols its inputs use
    outputs = CASES[case].build(g)
    g.outputs = outputs
    return g


def _inputs(g: Graph, seq: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [[seq if not isinstance(d, int) else d for d in v.shape] for v in g.inputs]
    return [rng.standard_normal(shape).astype(np.float32) if v.dtype == DType.f32
            else rng.random(shape) > 0.3 for v, shape in zip(g.inputs, shapes)]


@pytest.mark.parametrize("case, lowering, without", [
    ("multi_head_attention_gqa", CAUSAL, None),
    ("multi_head_attention_gqa", GQA, CAUSAL),
    ("multi_head_attention_plain_gqa", CAUSAL, None),
    ("multi_head_attention_plain_gqa", GQA, CAUSAL),
    ("multi_head_attention_size8", CAUSAL, None),  # any head size
    ("multi_head_attention_size8", None, CAUSAL),  # ORT's GQA needs head sizes of 16k
    ("multi_head_attention_masked", None, None),   # both are causal only, MHA has no rotary
    ("multi_head_attention_bool_mask", MHA, None),  # KV heads repeated in [b, s, h*d]
    ("multi_head_attention_padding", MHA, None),    # BERT's additive padding mask
    # CausalAttention has no window or softcap; GQA's local_window_size is the window (CPU)
    ("multi_head_attention_window", GQA, None),
    ("multi_head_attention_window", None, GQA),
    ("multi_head_attention_window_softcap", GQA, None),
    ("multi_head_attention_softcap", GQA, None),
    ("multi_head_attention_softcap", None, GQA),
])
def test_lowering_choice_and_values(case, lowering, without, tmp_path):
    g = _graph(case)
    options = {"exclude_kernels": [without]} if without else {}
    kernels = installed_kernels().without([without] if without else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContribFallbackWarning)  # for the excluded kernel
        lowered = lower_graph(g, {}, kernels)
        path = compile_graph(g, tmp_path / "m.dz", options)
    assert lowered.variants() == ({lowering: 1} if lowering else {})
    ops = {n.op_type for n in lowered.model.graph.node}
    if lowering:  # the whole block is one kernel: no head transposes, no rotary ops
        assert "Transpose" not in ops and "Neg" not in ops
    run = load(path)
    for seq in (5, 12, 33):
        x = _inputs(g, seq)
        want = run_graph(g, {}, x)[0].numpy()
        np.testing.assert_allclose(run(x)[0], want, rtol=1e-5, atol=1e-5)


def test_missing_attention_kernels_fall_back_with_a_warning(tmp_path):
    g = _graph("multi_head_attention_gqa")
    kernels = installed_kernels().without([CAUSAL, GQA])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lowered = lower_graph(g, {}, kernels)
        path = compile_graph(g, tmp_path / "m.dz", {"exclude_kernels": [CAUSAL, GQA]})
    said = [str(w.message) for w in caught if w.category is ContribFallbackWarning]
    assert [m.split()[0] for m in said] == [CAUSAL, GQA] * 2  # each named, in preference order
    assert lowered.variants() == {}
    ops = {n.op_type for n in lowered.model.graph.node}
    # the decomposition, with standard ops: MultiHeadAttention is not picked for causal attention
    assert "Softmax" in ops and not {"MultiHeadAttention", "GroupQueryAttention"} & ops
    x = _inputs(g, 6)
    np.testing.assert_allclose(load(path)(x)[0], run_graph(g, {}, x)[0].numpy(), rtol=1e-5,
                               atol=1e-5)


HALVES = """
graph halves {
  symbol s0 in [1, 64]
  input %f: f32[1, s0, 4]
  input %g: f32[1, s0, 4]
  input %w: f32[8]
  %both: f32[1, s0, 8] = concat(%f, %f) {dim=-1}
  %mixed: f32[1, s0, 8] = concat(%f, %g) {dim=-1}
  %cos: f32[1, s0, 8] = cos(%both)
  %one: f32[] = constant() {value=1.0, dtype=f32}
  %scaled: f32[1, s0, 8] = mul(%cos, %one)
  %table: f32[1, 1, s0, 8] = reshape(%scaled) {shape=[1, 1, s0, 8]}
  %sum: f32[1, s0, 8] = add(%cos, %both)
  %weighted: f32[1, s0, 8] = mul(%cos, %w)
  %mixed_cos: f32[1, s0, 8] = cos(%mixed)
  %rows: f32[2, s0, 4] = concat(%f, %f) {dim=0}
  %moved: f32[1, 8, s0] = permute(%cos) {dims=[0, 2, 1]}
  %last: f32[1, s0, 4] = slice(%cos) {dim=2, start=0, end=4, step=1}
  return %table, %sum, %weighted, %mixed_cos, %rows, %moved, %last
}
"""


@pytest.mark.parametrize("name, expected", [
    ("table", True),       # cos(concat(f, f)) * 1, reshaped: transformers' rotary table
    ("sum", True),         # both operands have equal halves
    ("weighted", False),   # a per-channel weight breaks the symmetry
    ("mixed_cos", False),  # concat of two different tensors
    ("rows", False),       # concatenated along another dim
    ("moved", False),      # the last dim moved away
    ("last", False),       # sliced along the last dim
])
def test_equal_halves_is_proved_or_refused(name, expected):
    g = parse_ir(HALVES)
    value = next(v for v in g.outputs if v.name == name)
    assert equal_halves(value) is expected


PACKED = """
graph packed {
  symbol s0 in [1, 64]
  input %qkv: f32[2, s0, 128]
  %q: f32[2, s0, 64] = slice(%qkv) {dim=-1, start=0, end=64, step=1}
  %k: f32[2, s0, 32] = slice(%qkv) {dim=2, start=K, step=1}
  %v: f32[2, s0, 32] = slice(%qkv) {dim=-1, start=V, step=1}
  %out: f32[2, s0, 64] = multi_head_attention(%q, %k, %v, _, _, _) """ \
    """{num_heads=4, kv_num_heads=2, is_causal=true}
  return %out
}
"""


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("kernel", [CAUSAL, GQA])
def test_packed_projection_is_read_whole(swap, kernel, tmp_path):
    """q, k, v cut from one projection in [q | k | v] order: the kernel takes the projection
    packed and the slices are not run (inspect shows them lowered to nothing); k and v swapped:
    unpacked."""
    k, v = ("64, end=96", "96, end=128")[::-1 if swap else 1]
    g = parse_ir(PACKED.replace("start=K", f"start={k}").replace("start=V", f"start={v}"))
    other = GQA if kernel == CAUSAL else CAUSAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContribFallbackWarning)
        lowered = lower_graph(g, {}, installed_kernels().without([other]))
        path = compile_graph(g, tmp_path / "m.dz", {"exclude_kernels": [other]})
    (node,) = [n for n in lowered.model.graph.node if n.op_type == kernel.split(".")[-1]]
    ops = {n.op_type for n in lowered.model.graph.node}
    if swap:
        assert list(node.input[:3]) == ["q", "k", "v"] and "Slice" in ops
    else:
        assert node.input[0] == "qkv" and not any(node.input[1:3])  # k, v absent
        assert "Slice" not in ops and "Split" not in ops
        assert [entry["onnx"] for entry in lowered.nodes[:3]] == [[], [], []]
    x = _inputs(g, 7)
    np.testing.assert_allclose(load(path)(x)[0], run_graph(g, {}, x)[0].numpy(), rtol=1e-5,
                               atol=1e-5)


def test_warning_says_whether_a_kernel_was_excluded_or_is_missing():
    from backends.onnxruntime.probe import KernelSet

    g = _graph("multi_head_attention_gqa")
    installed = installed_kernels()
    with pytest.warns(ContribFallbackWarning, match="CausalAttention is excluded"):
        lower_graph(g, {}, installed.without([CAUSAL]))
    build = KernelSet(k for k in installed._kernels if k[1] != "CausalAttention")
    with pytest.warns(ContribFallbackWarning, match="kernel is missing from this onnxruntime"):
        lower_graph(g, {}, build)
