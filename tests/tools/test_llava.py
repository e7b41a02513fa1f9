"""LLaVA as one artifact from (input_ids, pixel_values), its image-token merge included."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import backends
import compiler
import runtime
from compiler.config import load_config
from compiler.driver import lower_and_write
from compiler.ir import parse_ir, print_ir
from compiler.log import SILENT
from compiler.spec import load_spec
from compiler.tools.align_target import run_alignment, target_from_spec
from tests.numerics import assert_fp32_close, fp32_bound

ROOT = Path(__file__).resolve().parents[2]
LLAVA = f"{ROOT}/examples/llava.py:build"


def _examples():
    spec = importlib.util.spec_from_file_location("llava_example", ROOT / "examples/llava.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    """The spec, its exported graph and text, and the onnxruntime artifact compiled from it."""
    spec = load_spec(LLAVA)
    graph = compiler.export(spec.module, spec.example_inputs, dynamic_shapes=spec.dynamic_shapes)
    text = print_ir(graph)
    copy = parse_ir(text)  # the passes change their graph in place
    copy.weight_data = dict(graph.weight_data)
    path = lower_and_write(copy, tmp_path_factory.mktemp("llava") / "llava.dz",
                           backends.get("onnxruntime"), load_config(None), passes=None,
                           dump_ir=None, force=False, log=SILENT)
    return spec, graph, text, path


def test_one_graph_with_the_merge_and_no_data_checks(llava):
    spec, graph, text, _ = llava
    ops = [n.op for n in graph.nodes]
    assert ops.count("masked_scatter") == 1
    merge = next(n for n in graph.nodes if n.op == "masked_scatter")
    assert merge.loc.endswith("modeling_llava.py:236")
    assert [v.name for v in graph.inputs] == ["input_ids", "pixel_values"]
    assert str(graph.inputs[0].type) == "i64[1, s0]" and graph.symbols["s0"] == (17, 256)
    assert "conv" in ops  # the CLIP patch embedding: the vision tower is in the same graph
    assert "_local_scalar_dense" not in text and "assert" not in text


@pytest.mark.parametrize("before,after,seed", [(3, 5, 1), (0, 30, 4), (11, 1, 9)])
def test_artifact_matches_eager_for_prompts_of_any_length(llava, before, after, seed):
    spec, _, _, path = llava
    example = _examples()
    ids, pixels = example.prompt(before, after, seed), example.image(seed + 1)
    model = runtime.load(path)
    got = model(ids, pixels)[0]
    with torch.no_grad():
        want = spec.module(ids, pixels).numpy()
    assert got.shape == (1, before + 16 + after, 256)
    assert_fp32_close(got, want)


def test_image_features_land_where_the_image_tokens_are(llava):
    """Moving the image tokens moves where the image changes the logits."""
    spec, _, _, path = llava
    example = _examples()
    model = runtime.load(path)
    ids = example.prompt(4, 4, seed=2)
    a, b = example.image(1), example.image(2)
    diff = np.abs(model(ids, a)[0] - model(ids, b)[0]).max(axis=-1)[0]
    assert diff[:4].max() == 0.0  # causal: text before the image does not see it
    assert diff[4:].min() > 0.0


def test_alignment_of_the_compiled_llava(llava):
    spec, graph, _, path = llava
    with target_from_spec(spec, artifact=path, reference=graph) as target:
        report = run_alignment(target, target.example_inputs)
    assert report.ok
    # the reference interpreter runs the exported (decomposed) ops, not the module's own code
    assert report.eager_max_abs <= fp32_bound(*report.reference_outputs)
    merged = next(c for c in report.checks if c.op == "masked_scatter")
    # the merge comes after the vision tower's layer the projector reads (feature layer -2)
    assert merged.errors.max_abs < 1e-5 and merged.layer == "encoder.layers.0"
    layers = {c.layer for c in report.checks}
    assert {"encoder.layers.0", "language_model.layers.0", "language_model.layers.1"} <= layers
