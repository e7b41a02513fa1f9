"""Every bundled example compiles on onnxruntime, passes onnx.checker, and matches torch eager
(fp32, 1e-5) at three sizes of its symbolic dims from one artifact and one session."""

from __future__ import annotations

import pytest

import compiler
import runtime
from tests.backends.onnxruntime_util import check_onnx
from tests.test_end_to_end import SIZES, build, matches_eager


@pytest.mark.parametrize("name", sorted(SIZES))
def test_example_on_onnxruntime_matches_eager(name, tmp_path):
    model, inputs, *rest = build(name)
    path = compiler.compile(model, inputs, out=tmp_path / f"{name}.dz", backend="onnxruntime",
                            dynamic_shapes=rest[0] if rest else None)
    check_onnx(path)
    loaded = runtime.load(path)
    matches_eager(loaded, model, inputs, SIZES[name])
