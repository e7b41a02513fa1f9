"""Op conformance of the triton backend (under the interpreter): every sample graph of the shared
op cases whose nodes the backend supports runs through generated kernels (or its host ops) and
matches the reference interpreter at two sizes of s0, within max(1e-4, the case's tolerance)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import pytest  # noqa: E402

from backends.triton import TritonBackend  # noqa: E402
from compiler.errors import DayzeroError  # noqa: E402
from compiler.writer import write_artifact  # noqa: E402
from runtime.artifact import Artifact
from tests.backends.onnxruntime_cases import CASES  # noqa: E402
from tests.backends.test_onnxruntime_ops import build, matches_reference  # noqa: E402

pytest.importorskip("triton")


def _covered() -> list[str]:
    backend = TritonBackend()
    names = []
    for name, case in sorted(CASES.items()):
        try:
            graph = build(case)
        except DayzeroError:
            continue
        if all(backend.supports(n) for n in graph.nodes):
            names.append(name)
    return names


COVERED = _covered()


def test_conformance_subset_is_not_empty():
    kernels = {"add", "exp", "softmax", "layer_norm", "rms_norm", "sum", "where", "gelu"}
    assert len(COVERED) > 40 and kernels <= {n.split("_")[0] for n in COVERED} | set(COVERED)


@pytest.mark.parametrize("name", COVERED)
def test_op_matches_reference(name, tmp_path):
    case = CASES[name]
    graph = build(case)
    path = write_artifact(tmp_path / "m.dz", graph, TritonBackend())
    exe = TritonBackend().load(Artifact(path))
    matches_reference(exe, graph, case, name, max(1e-4, case.tol))
