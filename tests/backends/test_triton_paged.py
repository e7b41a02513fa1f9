"""paged_attention on the triton backend: its Triton kernel (under Triton's interpreter here, on
tiny shapes) against a float64 evaluation of the op's decomposition, and a compiled graph that
runs it."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tests.backends.paged_cases import NAMES, Step, assert_same, reference  # noqa: E402

pytest.importorskip("triton")

from backends.triton import device  # noqa: E402

STEPS = {  # small: the interpreter runs every program in Python
    "prefill": Step([(0, 5)], heads=2, kv_heads=1, size=16),
    "mixed-gqa": Step([(5, 3), (20, 1), (3, 1)], heads=4, kv_heads=2, size=16, pool=32),
    "mha-no-rotary-window": Step([(9, 2), (17, 1)], heads=2, kv_heads=2, size=8, rotary=False,
                                 attrs=dict(window=6)),
    "softcap-v-size": Step([(4, 2), (12, 1)], heads=2, kv_heads=1, size=16, v_size=8,
                           attrs=dict(softcap=2.0, scale=0.7)),
}


def _run(step: Step, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    from backends.triton.paged import paged_attention, supported

    where = device()
    x = [None if n not in arrays else torch.from_numpy(arrays[n]).to(where) for n in NAMES]
    attrs = dict(num_heads=step.heads, kv_num_heads=step.kv_heads, **step.attrs)
    assert supported(*x[:6], **attrs)
    return [t.cpu().numpy() for t in paged_attention(*x, **attrs)]


@pytest.mark.parametrize("case", sorted(STEPS))
def test_kernel_matches_the_decomposition_in_float64(case):
    step = STEPS[case]
    arrays = step.arrays()
    for got, want in zip(_run(step, arrays), reference(step, arrays)):
        assert got.shape == want.shape
        assert_same(got, want, tol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy's 0 / 0
def test_nonfinite_values_follow_the_decomposition():
    step = Step([(6, 2), (9, 1)], heads=2, kv_heads=1, size=16, pool=24, attrs=dict(window=5),
                seed=4)
    arrays = step.arrays()
    slots = arrays["seq_slots"]
    arrays["v_cache"][slots[1, 6], 0, 3] = np.nan    # visible to sequence 1's token
    arrays["k_cache"][slots[1, 1]] = np.nan          # before its window: never read
    arrays["v_cache"][slots[0, 0]] = np.inf          # visible to sequence 0's first token only
    arrays["token_len"][0] = 0                       # sees nothing: NaN
    got, want = _run(step, arrays), reference(step, arrays)
    assert np.isnan(got[0][0, 0]).all()
    for g, w in zip(got, want):
        assert_same(g, w, tol=1e-5)


def test_a_compiled_graph_runs_the_kernel_and_matches_the_reference(tmp_path, monkeypatch):
    from backends.reference.interpreter import run_graph
    from backends.triton import TritonBackend, paged
    from compiler.ir import DType
    from compiler.writer import write_artifact
    from runtime.artifact import Artifact

    step = STEPS["mixed-gqa"]
    arrays = step.arrays()
    g = step.graph(DType.f32, arrays)
    assert TritonBackend().supports(g.nodes[0])
    calls = []
    real = paged.paged_attention
    monkeypatch.setattr(paged, "paged_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    path = write_artifact(tmp_path / "m.dz", g, TritonBackend())
    x = [arrays[v.name] for v in g.inputs]
    got = TritonBackend().load(Artifact(path))(x)
    assert calls, "the Triton paged kernel did not run"
    for out, want in zip(got, run_graph(g, {}, x)):
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)
