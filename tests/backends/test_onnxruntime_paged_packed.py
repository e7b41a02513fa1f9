"""dayzero's PagedAttention kernel reading q, k and v packed in one tensor: the [q | k | v]
columns of a merged QKV projection, which the lowering hands over whole instead of running a
Split before the kernel (decode steps of merged-projection checkpoints)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, TensorType, symbol
from tests.backends.onnxruntime_util import compile_graph, load
from tests.backends.paged_cases import NAMES, STEPS, Step, assert_same, reference
from tests.backends.test_onnxruntime_paged import run_native


def packed(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {k: a for k, a in arrays.items() if k not in ("k", "v")}
    out["q"] = np.concatenate([arrays["q"], arrays["k"], arrays["v"]], axis=-1)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["prefill", "decode-scattered", "mixed", "mixed-mha",
                                  "mixed-mqa-no-rotary", "window-softcap-odd-size",
                                  "long-decode"])
def test_packed_equals_separate_inputs_and_the_decomposition(case, threads):
    step = STEPS[case]
    arrays = step.arrays()
    got = run_native(step, packed(arrays), threads)
    separate = run_native(step, arrays, threads)
    for g, s, w in zip(got, separate, reference(step, arrays)):
        np.testing.assert_array_equal(g, s)  # the same arithmetic, only the strides differ
        assert_same(g, w)


def test_nan_in_the_packed_keys_reaches_the_rows_that_see_them():
    step = Step([(11, 2), (30, 1)], seed=5)
    arrays = step.arrays()
    arrays["k"][0, 1, 3] = np.nan  # token 1's key, kv head 0: seen by itself only
    got = run_native(step, packed(arrays))
    for g, w in zip(got, reference(step, arrays)):
        assert_same(g, w)
    assert np.isnan(got[0][0, 1]).any() and not np.isnan(got[0][0, 0]).any()


@pytest.mark.parametrize("change, message", [
    (lambda a: a.__setitem__("q", a["q"][..., :-1]), r"a packed q must be \[1, tokens, "),
    (lambda a: a.__setitem__("k", a["q"][..., :32]), "k and v come together"),
])
def test_bad_packed_input_is_named(change, message):
    step = Step([(4, 2), (6, 1)])
    arrays = packed(step.arrays())
    change(arrays)
    with pytest.raises(Exception, match=f"PagedAttention: .*{message}"):
        run_native(step, arrays)


def _sliced_graph(v_size: int | None) -> tuple[Graph, dict[str, np.ndarray]]:
    """paged_attention whose q, k and v are consecutive slices of one [1, s0, width] input."""
    step = Step([(11, 5), (30, 1), (7, 1)], v_size=v_size)
    arrays = step.arrays()
    qkv = np.concatenate([arrays["q"], arrays["k"], arrays["v"]], axis=-1)
    g = Graph("paged")
    g.symbols["s0"] = (1, 4096)  # the step's token count (the artifact declares its symbols)
    s0 = symbol("s0")
    source = g.add_input("qkv", TensorType(DType.f32, (1, s0, qkv.shape[-1])))
    cuts, start = [], 0
    for name in ("q", "k", "v"):
        width = arrays[name].shape[-1]
        cuts.append(g.add_node("slice", [source], dict(dim=-1, start=start, end=start + width,
                                                       step=1)).outputs[0])
        start += width
    rest = []
    for name in NAMES[3:]:
        a = arrays[name]
        dims = tuple(s0 if (name in ("cos", "sin") and i == 0)
                     or (name in ("token_seq", "token_len")) else d
                     for i, d in enumerate(a.shape))
        rest.append(g.add_input(name, TensorType(DType.i64 if a.dtype == np.int64
                                                 else DType.f32, dims)))
    node = g.add_node("paged_attention", cuts + rest, dict(num_heads=4, kv_num_heads=2))
    g.outputs = list(node.outputs)
    return g, {"qkv": qkv, **{n: arrays[n] for n in NAMES[3:]}}


@pytest.mark.parametrize("v_size, is_packed", [(None, True), (12, False)])
def test_the_lowering_hands_the_projection_over_whole(tmp_path, v_size, is_packed):
    g, arrays = _sliced_graph(v_size)
    x = [arrays[v.name] for v in g.inputs]
    want = [t.numpy() for t in run_graph(g, {}, x)]
    path = compile_graph(g, tmp_path / "m.dz")
    model = onnx.load(str(path / "backend" / "model.onnx"), load_external_data=False)
    (paged,) = [n for n in model.graph.node if n.op_type == "PagedAttention"]
    ops = {n.op_type for n in model.graph.node}
    if is_packed:  # no Slice or Split left: the kernel reads the projection in place
        assert list(paged.input[:3]) == ["qkv", "", ""] and not ops & {"Slice", "Split"}
    else:          # a value head of another size: three tensors of their own
        assert all(paged.input[:3]) and paged.input[0] != "qkv"
    for got, w in zip(load(path)(x), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", [dict, packed])
def test_a_step_of_many_tokens_takes_several_kv_heads_per_task(layout):
    """33 blocks of 32 tokens make enough tasks for the kernel to keep both kv heads in one
    (a step of few tokens, such as a decode step, gives each kv head its own task instead:
    every other case here)."""
    step = Step([(0, 530), (30, 526)], pool=64, pad=1, seed=7)
    arrays = step.arrays()
    got = run_native(step, layout(arrays))
    for g, w in zip(got, reference(step, arrays)):
        assert_same(g, w)
