"""Every bundled example compiles on `reference` and matches torch eager within 1e-5 (fp32),
with one artifact run at three sizes of its symbolic dims (no recompilation)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import compiler
import runtime
from tests.numerics import assert_fp32_close

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SIZES = {"llama": (7, 64, 300), "gpt2": (7, 64, 300), "bert": (7, 64, 300), "mlp": (1, 5, 33),
         "vit": (None,)}


def build(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def resized(example: torch.Tensor, spec, size: int | None, seed: int) -> torch.Tensor:
    """An input like `example`, with every symbolic dim set to `size`."""
    shape = [d if isinstance(d, int) else _within(size or example.shape[i], spec.ranges[d])
             for i, d in enumerate(spec.shape)]
    gen = torch.Generator().manual_seed(seed)
    if example.dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=example.dtype)
    return torch.randint(0, int(example.max()) + 1, shape, generator=gen, dtype=example.dtype)


def _within(size: int, bounds) -> int:
    lo, hi = bounds
    return max(lo, size if hi is None else min(size, hi))


def eager_outputs(model, inputs) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*inputs)
    if isinstance(out, torch.Tensor):
        out = (out,)
    return [t.numpy() for t in out]


def matches_eager(loaded, model, inputs, sizes, tol: float = 1e-5) -> None:
    """The artifact against eager at each size (the examples' symbolic dims set to it)."""
    for i, size in enumerate(sizes):
        new = tuple(resized(x, s, size, seed=i) for x, s in zip(inputs, loaded.input_specs))
        got = loaded(*new)
        want = eager_outputs(model, new)
        assert len(got) == len(want)
        for j, (g, w) in enumerate(zip(got, want)):
            assert_fp32_close(g, w, rel=tol, what=f"output {j} at size {size}")


@pytest.mark.parametrize("name", sorted(SIZES))
def test_example_matches_eager_at_three_sizes(name, tmp_path):
    model, inputs, *rest = build(name)
    path = compiler.compile(model, inputs, out=tmp_path / f"{name}.dz", backend="reference",
                            dynamic_shapes=rest[0] if rest else None)
    hashes_before = (path / "manifest.json").read_bytes()
    loaded = runtime.load(path)
    matches_eager(loaded, model, inputs, SIZES[name])
    assert (path / "manifest.json").read_bytes() == hashes_before  # nothing recompiled or rewritten
    text = (path / "graph.dzir").read_text()
    assert compiler.ir.print_ir(compiler.ir.parse_ir(text)) == text


class CacheStep(torch.nn.Module):
    """A hand-written decode step: positions and scalars computed from a dynamic cache length
    (a `constant` and a `full` whose value is the symbol: 'Cannot convert symbols to int' once)."""

    def forward(self, x, past):
        n = past.shape[1]
        positions = torch.arange(n, n + x.shape[1])
        length = torch.tensor(n, dtype=torch.float32)
        return torch.cat([past, x], 1) * 2 + positions[None, :, None] + torch.full((1,), n) + length


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "triton"])
def test_values_computed_from_a_dynamic_cache_length(backend, tmp_path):
    from torch.export import Dim

    model, x = CacheStep(), torch.randn(1, 1, 4)
    path = compiler.compile(model, (x, torch.randn(1, 5, 4)), out=tmp_path / "step.dz",
                            backend=backend, dynamic_shapes=({}, {1: Dim("past", max=64)}))
    loaded = runtime.load(path)
    for n in (2, 5, 9):
        past = torch.randn(1, n, 4)
        assert_fp32_close(loaded(x, past)[0], model(x, past), what=f"past length {n}")


class Scalars(torch.nn.Module):
    def forward(self, a, b):
        return a + b, a.exp(), b, a.cumsum(0)  # ONNX CumSum refuses a scalar


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "triton"])
def test_zero_dim_inputs_and_outputs_keep_their_rank(backend, tmp_path):
    """np.ascontiguousarray turns a 0-d array into shape [1]; the onnxruntime backend used it
    on inputs, and every 0-d output came back as [1] (caught by the output-shape check)."""
    if backend == "triton":
        pytest.importorskip("triton")
    a, b = torch.tensor(1.5), torch.tensor(-2.0)
    path = compiler.compile(Scalars(), (a, b), tmp_path / "m.dz", backend=backend)
    got = runtime.load(path)(a.numpy(), b.numpy())
    for g, w in zip(got, Scalars()(a, b)):
        assert np.shape(g) == () and float(g) == pytest.approx(float(w), rel=1e-6)
