"""Every IR op lowers to ONNX and matches the reference interpreter, at two sizes of s0.

Driven by the table in onnxruntime_cases.py; each case is compiled once into an artifact (weights
as external data), checked with onnx.checker, then run at every size with one session. Ops that
have a fused ORT lowering run twice: with the installed kernels and with none (standard ops).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from backends.onnxruntime import OnnxRuntimeBackend
from backends.onnxruntime.fused import VARIANTS, ContribFallbackWarning
from backends.onnxruntime.op_table import CONVERTERS, limit
from backends.reference.interpreter import run_graph
from compiler.ir import OPS, DType, Graph, TensorType, print_ir, verify
from tests.backends.onnxruntime_cases import CASES, Case
from tests.backends.onnxruntime_util import check_onnx, compile_graph, load


def build(case: Case) -> Graph:
    g = Graph()
    g.symbols["s0"] = (1, 64)
    g.outputs = case.build(g)
    verify(g)
    return g


def inputs_for(graph: Graph, case: Case, size: int, seed: int) -> list[np.ndarray]:
    gen = np.random.default_rng(seed)
    arrays = []
    for value in graph.inputs:
        shape = [size if not isinstance(d, int) else d for d in value.type.shape]
        low, high = case.ranges.get(value.name, (-3.0, 3.0))
        dtype = value.type.dtype
        if dtype == DType.bool:
            arrays.append(gen.random(shape) < 0.5)
        elif dtype.is_float:
            arrays.append(gen.uniform(low, high, shape).astype(dtype.to_numpy()))
        else:
            arrays.append(gen.integers(int(low), int(high) + 1, shape).astype(dtype.to_numpy()))
    return arrays


# Transfers between ranks that have no single-rank form: the distributed runtime's job,
# refused here (test below).
RANK_TRANSFERS = {"send", "recv", "expert_dispatch", "expert_combine"}


def test_every_ir_op_has_a_converter_and_a_case():
    assert set(CONVERTERS) == set(OPS)
    covered = {node.op for case in CASES.values() for node in build(case).nodes}
    missing = set(OPS) - covered - RANK_TRANSFERS
    assert not missing, f"ops without a test case: {sorted(missing)}"


def test_transfers_between_ranks_are_refused_with_a_reason():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    nodes = [g.add_node("send", [x], {"peer": 1, "tag": 0}),
             g.add_node("recv", [], {"shape": [2, 3], "dtype": DType.f32, "peer": 1, "tag": 0}),
             g.add_node("all_reduce", [x], {"axis": "tp", "ranks": [0, 1]}),
             g.add_node("expert_combine", [x, g.add_input("n", TensorType(DType.i64, (2,))),
                                           g.add_input("w", TensorType(DType.f32, (2, 1))),
                                           g.add_input("i", TensorType(DType.i64, (2, 1)))],
                        {"axis": "ep", "experts": 2, "ranks": [0, 1]})]
    for node in nodes:
        assert not OnnxRuntimeBackend().supports(node)
        assert "runtime" in limit(node)


def _fusable(name: str) -> bool:
    return any(node.op in VARIANTS for node in build(CASES[name]).nodes)


PARAMS = [(name, "installed") for name in CASES]
PARAMS += [(name, "standard") for name in CASES if _fusable(name)]


@pytest.mark.parametrize("name,kernels", PARAMS, ids=[f"{n}-{k}" for n, k in PARAMS])
def test_op_matches_reference(name, kernels, tmp_path):
    case = CASES[name]
    graph = build(case)
    options = {} if kernels == "installed" else {"exclude_kernels": _all_contrib()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContribFallbackWarning)
        path = compile_graph(graph, tmp_path / "m.dz", options)
    check_onnx(path)
    matches_reference(load(path), graph, case, name, case.tol)


def matches_reference(exe, graph: Graph, case, name: str, tol: float) -> None:
    """`exe` (any backend's executable) against the reference interpreter at each of the case's
    sizes: same shapes and dtypes, floats within `tol`, everything else exactly."""
    for i, size in enumerate(case.sizes):
        inputs = inputs_for(graph, case, size, seed=i)
        want = [w.numpy() for w in run_graph(graph, graph.weight_data, inputs)]
        got = exe(inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            if w.dtype.kind in "fc":
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                           rtol=tol, atol=tol, equal_nan=True,
                                           err_msg=f"{name} at s0={size}\n{print_ir(graph)}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"{name} at s0={size}")


def _all_contrib() -> list[str]:
    return sorted({str(k) for variants in VARIANTS.values() for v in variants
                   for k in v.requires})


def test_backend_supports_every_op_in_its_capabilities():
    assert OnnxRuntimeBackend().capabilities().ops == frozenset(OPS)
