"""The GPT-2, BERT, ViT and LLaVA examples on the triton backend, under Triton's interpreter.

Each compiles twice, with the default pipeline (a kernel per op) and with fusion (fused ops, then
fusion groups as one kernel each), and one artifact runs at two sizes of its symbolic dims and
matches torch eager within 1e-4 (fp32). Only the conv patch embeddings of ViT and LLaVA's vision
tower run on the onnxruntime fallback (the backend has no conv kernel); the test asserts that
nothing else leaves triton. Sizes are small: the interpreter runs each kernel program in Python.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import compiler  # noqa: E402
import runtime  # noqa: E402
from compiler.ir import parse_ir  # noqa: E402
from passes import DEFAULT_PIPELINE  # noqa: E402
from tests.test_end_to_end import build, eager_outputs, resized  # noqa: E402

pytest.importorskip("triton")
# The interpreter computes masked-off lanes too (rsqrt(0) there is never stored).
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

TOL = 1e-4
# the plain cleanup pipeline, and the backend's own (fusion, fusion groups, memory plan)
PIPELINES = {"plain": DEFAULT_PIPELINE, "default": None}
# The ops that honestly leave triton: the backend has no convolution kernel.
FALLBACK_OPS = {"gpt2": [], "bert": [], "vit": ["conv"], "llava": ["conv"]}
SIZES = {"gpt2": (5, 11), "bert": (2, 5), "vit": (1, 2)}  # every symbolic dim set to the size
PROMPTS = [(3, 5, 1), (0, 2, 4)]  # LLaVA: text tokens before/after the image, seed


def _compile(name: str, model, inputs, dynamic, pipeline: str, tmp_path):
    fallback = "onnxruntime" if FALLBACK_OPS[name] else None
    return compiler.compile(model, inputs, out=tmp_path / f"{name}.dz", backend="triton",
                            dynamic_shapes=dynamic, passes=PIPELINES[pipeline],
                            fallback=fallback)


def _check_partition(name: str, pipeline: str, path) -> None:
    """Kernels were generated (fused into multi-op kernels with fusion), and exactly the
    expected ops run on the fallback."""
    listing = json.loads((path / "backend" / "kernels.json").read_text())
    ops = {n.outputs[0].name: n.op for n in parse_ir((path / "graph.dzir").read_text()).nodes}
    assert sorted(ops[n] for seg in listing["segments"] for n in seg["nodes"]) == \
        FALLBACK_OPS[name]
    kernels = listing["kernels"]
    assert len(kernels) > 5
    if pipeline == "default":
        assert max(len(k["nodes"]) for k in kernels) > 1, "no fusion group became one kernel"


def _compare(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("name", sorted(SIZES))
def test_example_on_triton_matches_eager_at_two_sizes(name, pipeline, tmp_path):
    model, inputs, *rest = build(name)
    path = _compile(name, model, inputs, rest[0] if rest else None, pipeline, tmp_path)
    _check_partition(name, pipeline, path)
    loaded = runtime.load(path)
    for i, size in enumerate(SIZES[name]):
        new = tuple(resized(x, s, size, seed=i) for x, s in zip(inputs, loaded.input_specs))
        _compare(loaded(*new), eager_outputs(model, new))


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_llava_on_triton_matches_eager_for_two_prompt_lengths(pipeline, tmp_path):
    example = _llava()
    model, inputs, dynamic = example.build()
    path = _compile("llava", model, inputs, dynamic, pipeline, tmp_path)
    _check_partition("llava", pipeline, path)
    loaded = runtime.load(path)
    for before, after, seed in PROMPTS:
        ids, pixels = example.prompt(before, after, seed), example.image(seed + 1)
        got = loaded(ids, pixels)
        assert got[0].shape == (1, before + example.IMAGE_TOKENS + after, 256)
        with torch.no_grad():
            want = model(ids, pixels)
        _compare(got, [want.numpy()])


def _llava():
    import importlib.util

    from tests.test_end_to_end import EXAMPLES

    spec = importlib.util.spec_from_file_location("example_llava", EXAMPLES / "llava.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
