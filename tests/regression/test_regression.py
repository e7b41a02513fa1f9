"""Stored references for text-only (Llama), image-only (ViT) and mixed (LLaVA) inputs, run on
every installed backend that supports the model.

The references are torch eager's outputs on fixed inputs (data/*.npz, written by
`make_references.py`). Each backend compiles the model and must reproduce them within 1e-5; a
backend that does not support every node of the model is skipped with the ops it lacks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import backends
import runtime
from compiler.config import load_config
from compiler.driver import lower_and_write
from compiler.errors import DayzeroError
from compiler.frontend import export
from compiler.ir import parse_ir, print_ir
from compiler.log import SILENT
from compiler.spec import load_spec
from tests.regression.cases import CASES

TOLERANCE = 1e-5
REGENERATE = "python tests/regression/make_references.py"
BACKENDS = backends.available()
for _name in BACKENDS:  # import each backend first: some configure their runtime on import
    try:
        backends.get(_name)
    except DayzeroError:
        pass  # reported by the test for that backend


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def case(request):
    """The case, its stored arrays, its spec and its exported graph (exported once)."""
    case = request.param
    stored = dict(np.load(case.path))
    spec = load_spec(case.spec_path)
    graph = export(spec.module, spec.example_inputs, dynamic_shapes=spec.dynamic_shapes)
    return case, stored, spec, graph


def _inputs(stored: dict, graph) -> list[np.ndarray]:
    return [stored[f"input.{v.name}"] for v in graph.inputs]


def _outputs(stored: dict) -> list[np.ndarray]:
    count = sum(1 for k in stored if k.startswith("output."))
    return [stored[f"output.{i}"] for i in range(count)]


def test_eager_still_gives_the_stored_outputs(case):
    """A failure here means the example model or transformers changed: rerun the script."""
    case, stored, spec, graph = case
    inputs = [torch.from_numpy(x) for x in _inputs(stored, graph)]
    with torch.no_grad():
        eager = [y.numpy() for y in pytree.tree_leaves(spec.module(*inputs))]
    for got, want in zip(eager, _outputs(stored), strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE,
                                   err_msg=f"{case.name}: regenerate with {REGENERATE}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_reproduces_the_stored_outputs(case, backend, tmp_path):
    case, stored, _, graph = case
    target = backends.get(backend)
    lacking = sorted({n.op for n in graph.nodes if not target.supports(n)})
    if lacking:
        pytest.skip(f"backend {backend} lacks {', '.join(lacking)}")
    copy = parse_ir(print_ir(graph))  # the passes change their graph in place
    copy.weight_data = dict(graph.weight_data)
    path = lower_and_write(copy, tmp_path / f"{case.name}.dz", target, load_config(None),
                           passes=None, dump_ir=None, force=False, log=SILENT)
    try:
        model = runtime.load(path)
    except DayzeroError as exc:
        if exc.where != f"backend {backend}":
            raise
        pytest.skip(f"backend {backend} cannot run in this process: {exc.what}")
    outputs = model(*_inputs(stored, graph))
    for got, want in zip(outputs, _outputs(stored), strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE,
                                   err_msg=f"{case.name} on {backend}")
