"""Image preprocessing compiled on its own; alignment catches a wrong channel order or norm."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import compiler
import runtime
from compiler.spec import load_spec
from compiler.tools.align_target import run_alignment, target_from_spec

ROOT = Path(__file__).resolve().parents[2]
PREPROCESS = f"{ROOT}/examples/preprocess.py"


def _module():
    spec = importlib.util.spec_from_file_location("preprocess_example",
                                                  ROOT / "examples/preprocess.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """An onnxruntime artifact per preprocessing variant."""
    root = tmp_path_factory.mktemp("preprocess")
    paths = {}
    for name in ("build", "build_bgr", "build_imagenet_norm"):
        spec = load_spec(f"{PREPROCESS}:{name}")
        paths[name] = compiler.compile(spec.module, spec.example_inputs, out=root / f"{name}.dz",
                                       dynamic_shapes=spec.dynamic_shapes)
    return paths


@pytest.mark.parametrize("height,width", [(48, 40), (32, 32), (9, 200), (300, 17)])
def test_any_image_size_matches_eager(compiled, height, width):
    example = _module()
    image = example.image(height, width, seed=height)
    got = runtime.load(compiled["build"])(image)[0]
    with torch.no_grad():
        want = example.Preprocess()(image).numpy()
    assert got.shape == (1, 3, 32, 32)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def _align(variant: str, compiled):
    spec = load_spec(f"{PREPROCESS}:build")
    with target_from_spec(spec, artifact=compiled[variant]) as target:
        return run_alignment(target, target.example_inputs)


def test_the_right_preprocessing_aligns(compiled):
    report = _align("build", compiled)
    assert report.ok and [c.op for c in report.checks if c.op != "constant"] == [
        "permute", "cast", "index_select", "resize", "div", "sub", "div"]


def test_wrong_channel_order_is_caught_at_the_channel_reorder(compiled):
    first = _align("build_bgr", compiled).first_failure
    assert first.op == "index_select" and first.loc.endswith("examples/preprocess.py:42")
    assert first.errors.cosine < 0.95


def test_wrong_normalization_is_caught_at_the_mean(compiled):
    report = _align("build_imagenet_norm", compiled)
    first = report.first_failure
    assert first.op == "sub" and first.loc.endswith("examples/preprocess.py:45")
    assert all(c.ok for c in report.checks if c.op in ("index_select", "resize"))
