"""paged_attention on ONNX Runtime: dayzero's native PagedAttention kernel, run as a one-node
ONNX model against a float64 evaluation of the op's decomposition (the reference interpreter on
the same graph in float64), its error messages, and the lowering that picks it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from backends.onnxruntime import convert_paged, native_ops
from backends.onnxruntime.session import SessionConfig, session_options
from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, TensorType, symbol
from tests.backends.onnxruntime_util import compile_graph, load
from tests.backends.paged_cases import NAMES, STEPS, Step, assert_same, reference

PAGED = "ai.dayzero.PagedAttention"


def one_node(step: Step, arrays: dict[str, np.ndarray]) -> onnx.ModelProto:
    size = step.size
    attrs = {"scale": float(step.attrs.get("scale") or size ** -0.5),
             "window": int(step.attrs.get("window") or 0),
             "softcap": float(step.attrs.get("softcap") or 0.0)}
    node = helper.make_node("PagedAttention", [n if n in arrays else "" for n in NAMES],
                            ["out", "new_k", "new_v"], domain=native_ops.DOMAIN,
                            num_heads=step.heads, kv_num_heads=step.kv_heads, **attrs)
    inputs = [helper.make_tensor_value_info(
        n, TensorProto.INT64 if arrays[n].dtype == np.int64 else TensorProto.FLOAT, None)
        for n in NAMES if n in arrays]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("out", "new_k", "new_v")]
    graph = helper.make_graph([node], "paged", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid(native_ops.DOMAIN, 1)])


def run_native(step: Step, arrays: dict[str, np.ndarray], threads: int = 2) -> list[np.ndarray]:
    options = session_options(SessionConfig(intra_op_threads=threads, allow_spinning=False))
    sess = ort.InferenceSession(one_node(step, arrays).SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, arrays)


def test_the_library_has_the_kernel():
    assert native_ops.library() is not None
    assert (native_ops.DOMAIN, "PagedAttention", "float") in native_ops.kernels()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", sorted(STEPS))
def test_matches_the_decomposition_in_float64(case, threads):
    step = STEPS[case]
    arrays = step.arrays()
    got = run_native(step, arrays, threads)
    want = reference(step, arrays)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert_same(g, w)


def test_nan_in_a_visible_value_propagates_and_hidden_slots_are_never_read():
    step = Step([(11, 5), (30, 1), (7, 1)], attrs=dict(window=6), seed=3)
    arrays = step.arrays()
    slots, v_cache, k_cache = arrays["seq_slots"], arrays["v_cache"], arrays["k_cache"]
    visible = slots[1, 28]        # sequence 1's token (position 30, window 6) sees keys 25..30
    hidden = slots[1, 3]          # before its window
    unlisted = sorted(set(range(step.pool)) - set(slots[slots >= 0].tolist()))[0]
    v_cache[visible, 1, 5] = np.nan
    for slot in (hidden, unlisted):
        k_cache[slot], v_cache[slot] = np.nan, np.inf
    got = run_native(step, arrays)
    want = reference(step, arrays)
    out = got[0].reshape(7, 4, 16)
    assert np.isnan(out[5, 2:, 5]).all()        # the heads of kv head 1, channel 5
    assert np.isfinite(np.delete(out, 5, axis=0)).all()
    for g, w in zip(got, want):
        assert_same(g, w)


@pytest.mark.parametrize("where, value", [("k", np.nan), ("k", np.inf), ("q", -np.inf),
                                          ("v", np.inf), ("k_cache", -np.inf)])
def test_nonfinite_inputs_follow_the_decomposition(where, value):
    step = Step([(11, 5), (30, 1), (7, 1)], rotary=False, seed=5)
    arrays = step.arrays()
    arrays[where].reshape(-1)[17] = value
    for g, w in zip(run_native(step, arrays), reference(step, arrays)):
        assert_same(g, w)


@pytest.mark.parametrize("case", ["wide-decode", "wide-split-decode"])
@pytest.mark.parametrize("where, value", [("k_cache", np.nan), ("k_cache", np.inf),
                                          ("v_cache", np.inf), ("v_cache", -np.inf),
                                          ("q", np.nan)])
def test_a_wide_decode_step_follows_the_decomposition_with_nonfinite_inputs(case, where,
                                                                            value):
    # sequence 2's token only: the tasks that take every kv head of one token at once must
    # not spill it into their neighbours
    step = STEPS[case]
    arrays = step.arrays()
    if where == "q":
        arrays["q"][0, 2, 3] = value
    else:
        arrays[where][arrays["seq_slots"][2, 4], 1, 5] = value
    got = run_native(step, arrays)
    assert not np.isfinite(got[0][0, 2]).all()
    assert np.isfinite(np.delete(got[0][0], 2, axis=0)).all()
    for g, w in zip(got, reference(step, arrays)):
        assert_same(g, w)


@pytest.mark.parametrize("where, value", [("k_cache", np.nan), ("k_cache", np.inf),
                                          ("v_cache", np.inf), ("v_cache", np.nan)])
def test_a_split_step_follows_the_decomposition_with_nonfinite_inputs(where, value):
    # "split-decode" splits sequence 0's 3001 keys into parts: position 1700 is in a middle one
    step = STEPS["split-decode"]
    arrays = step.arrays()
    arrays[where][arrays["seq_slots"][0, 1700], 1, 5] = value
    got = run_native(step, arrays)
    assert not np.isfinite(got[0][0, 0]).all()
    for g, w in zip(got, reference(step, arrays)):
        assert_same(g, w)


def test_a_part_whose_scores_are_all_minus_inf_weighs_nothing_but_its_infinite_value_poisons():
    # the first of the 5 parts of 3001 keys, positions 0..599, scores -inf for every head: it
    # weighs 0 once the later parts' finite scores come, and 0 * Inf is NaN in its channel
    step = Step([(3000, 1)], heads=8, kv_heads=2, size=64, rotary=False, pool=3100)
    arrays = step.arrays()
    arrays["q"][0, 0, ::64] = np.abs(arrays["q"][0, 0, ::64]) + 0.1
    first = arrays["seq_slots"][0, :600]
    arrays["k_cache"][first] = 0.0
    arrays["k_cache"][first, :, 0] = -np.inf
    arrays["v_cache"][first[7], 1, 3] = np.inf
    got = run_native(step, arrays)
    out = got[0].reshape(8, 64)
    assert np.isnan(out[4:, 3]).all() and np.isfinite(np.delete(out[4:], 3, axis=1)).all()
    assert np.isfinite(out[:4]).all()
    for g, w in zip(got, reference(step, arrays)):
        assert_same(g, w)


def test_a_token_without_visible_keys_is_nan_as_in_the_decomposition():
    step = Step([(4, 1), (6, 1)], rotary=False)
    arrays = step.arrays()
    arrays["token_len"][0] = 0
    got, want = run_native(step, arrays)[0], reference(step, arrays)[0]
    assert np.isnan(got[0, 0]).all() and np.isfinite(got[0, 1]).all()
    assert_same(got, want)


@pytest.mark.parametrize("change, message", [
    (lambda a: a["seq_slots"].__setitem__((0, 2), 64), "a visible slot of seq_slots is outside"),
    (lambda a: a["seq_slots"].__setitem__((0, 2), -9), "a visible slot of seq_slots is outside"),
    (lambda a: a["token_seq"].__setitem__(0, 2), r"token_seq\) is not a row"),
    (lambda a: a.update(cos=a["cos"][:1], sin=a["sin"][:1]), "fewer rows than tokens"),
    (lambda a: a.__setitem__("cos", a["cos"][:1]), r"cos and sin must both be \[rows"),
    (lambda a: a.__setitem__("k_cache", a["k_cache"][:, :1]), "k_cache and v_cache must be"),
    (lambda a: a.__setitem__("token_len", a["token_len"][:1]), "token_len"),
])
def test_bad_input_is_named(change, message):
    step = Step([(4, 2), (6, 1)])
    arrays = step.arrays()
    change(arrays)
    with pytest.raises(Exception, match=f"PagedAttention: .*{message}"):
        run_native(step, arrays)


def test_the_fit_check_limits_are_the_kernels():
    header = (Path(native_ops.__file__).parent / "native" / "paged_attention.h").read_text()

    def constant(name):
        return int(re.search(rf"{name} = (\d+);", header).group(1))
    assert convert_paged.PAGED_MAX_HEAD_SIZE == constant("kPagedMaxHeadSize")
    assert convert_paged.PAGED_MAX_HEADS == constant("kPagedMaxHeads")


TOKEN_AXES = {"q": 1, "k": 1, "v": 1, "cos": -2, "sin": -2, "token_seq": 0, "token_len": 0}


def _e2e_graph(tables_rank: int) -> tuple[Graph, dict[str, np.ndarray]]:
    """paged_attention with a symbolic token count, rotary tables [.., tokens, head_size]."""
    step = Step([(11, 5), (30, 1), (7, 1)], attrs=dict(window=9))
    g = Graph("paged")
    g.symbols["s0"] = (1, 4096)  # the step's token count (the artifact declares its symbols)
    arrays = step.arrays()
    lead = (1,) * (tables_rank - 2)
    values = []
    for name in NAMES:
        a = arrays[name]
        if name in ("cos", "sin"):
            a = arrays[name] = a.reshape(*lead, *a.shape)
        axis = TOKEN_AXES[name] % a.ndim if name in TOKEN_AXES else None
        dims = tuple(symbol("s0") if i == axis else d for i, d in enumerate(a.shape))
        values.append(g.add_input(name, TensorType(DType.i64 if a.dtype == np.int64
                                                   else DType.f32, dims)))
    node = g.add_node("paged_attention", values, dict(num_heads=4, kv_num_heads=2, window=9))
    g.outputs = list(node.outputs)
    return g, arrays


@pytest.mark.parametrize("tables_rank", [2, 4])
def test_compiled_graph_uses_the_kernel_and_matches_the_reference_backend(tmp_path,
                                                                          tables_rank):
    g, arrays = _e2e_graph(tables_rank)
    path = compile_graph(g, tmp_path / "m.dz")
    record = json.loads((path / "backend" / "lowering.json").read_text())
    assert record["variants"] == {PAGED: 1}
    model = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False)
    assert [n.op_type for n in model.graph.node if n.domain == native_ops.DOMAIN] == \
        ["PagedAttention"]
    x = [arrays[n] for n in NAMES]
    want = [t.numpy() for t in run_graph(g, {}, x)]
    for got, w in zip(load(path)(x), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


def test_what_the_kernel_does_not_do_lowers_through_the_decomposition(tmp_path):
    g = Graph("paged")
    f64 = TensorType(DType.f64, (1, 3, 32))
    ins = [g.add_input("q", f64), g.add_input("k", TensorType(DType.f64, (1, 3, 16))),
           g.add_input("v", TensorType(DType.f64, (1, 3, 16))), None, None,
           g.add_input("kc", TensorType(DType.f64, (8, 2, 8))),
           g.add_input("vc", TensorType(DType.f64, (8, 2, 8))),
           g.add_input("slots", TensorType(DType.i64, (1, 4))),
           g.add_input("seq", TensorType(DType.i64, (3,))),
           g.add_input("len", TensorType(DType.i64, (3,)))]
    node = g.add_node("paged_attention", ins, dict(num_heads=4, kv_num_heads=2))
    assert convert_paged.paged_fits(node) == "PagedAttention runs float32"
    g.outputs = list(node.outputs)
    path = compile_graph(g, tmp_path / "m.dz")
    record = json.loads((path / "backend" / "lowering.json").read_text())
    assert PAGED not in record["variants"]


def test_without_the_library_the_decomposition_runs_and_artifacts_run_their_portable_model(
        monkeypatch, tmp_path):
    import warnings

    from backends.onnxruntime.fused import ContribFallbackWarning
    from backends.onnxruntime.probe import installed_kernels

    g, arrays = _e2e_graph(2)
    x = [arrays[n] for n in NAMES]
    want = [t.numpy() for t in run_graph(g, {}, x)]
    native = compile_graph(g, tmp_path / "native.dz")
    assert "PagedAttention" in json.loads(
        (native / "backend" / "lowering.json").read_text())["portable"]["replaces"][0]
    monkeypatch.setattr(native_ops, "library", lambda: None)
    installed_kernels.cache_clear()
    try:
        with pytest.warns(ContribFallbackWarning,
                          match="ai.dayzero.PagedAttention kernel is missing"):
            fallback = compile_graph(g, tmp_path / "fallback.dz")
        assert "PagedAttention" not in (fallback / "backend" / "lowering.json").read_text()
        for got, w in zip(load(fallback)(x), want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            portable = load(native)
        messages = [str(w.message) for w in caught]
        assert len(messages) == 1 and issubclass(caught[0].category,
                                                 native_ops.PortableFallbackWarning)
        assert "ai.dayzero.PagedAttention are not available" in messages[0]
        for got, w in zip(portable(x), want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    finally:
        installed_kernels.cache_clear()
