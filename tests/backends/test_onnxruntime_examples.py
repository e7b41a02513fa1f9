"""Every bundled example compiles on onnxruntime, passes onnx.checker, and matches torch eager
(fp32, 1e-5) at three sizes of its symbolic dims from one artifact and one session."""

from __future__ import annotations

import numpy as np
import pytest

import compiler
import runtime
from tests.backends.onnxruntime_util import check_onnx
from tests.test_end_to_end import SIZES, build, eager_outputs, resized


@pytest.mark.parametrize("name", sorted(SIZES))
def test_example_on_onnxruntime_matches_eager(name, tmp_path):
    model, inputs, *rest = build(name)
    path = compiler.compile(model, inputs, out=tmp_path / f"{name}.dz", backend="onnxruntime",
                            dynamic_shapes=rest[0] if rest else None)
    check_onnx(path)
    loaded = runtime.load(path)
    for i, size in enumerate(SIZES[name]):
        new = tuple(resized(x, s, size, seed=i) for x, s in zip(inputs, loaded.input_specs))
        got = loaded(*new)
        want = eager_outputs(model, new)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
