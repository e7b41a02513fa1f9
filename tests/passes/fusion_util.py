"""Helpers for the fusion tests: run a pipeline on IR text and compare values before and after."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

import torch

from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, parse_ir, print_ir, verify
from compiler.ir.symbolic import evaluate
from passes import PassManager


def random_tensor(type, bindings: Mapping[str, int], gen: torch.Generator) -> torch.Tensor:
    shape = [evaluate(d, bindings) for d in type.shape]
    if type.dtype == DType.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if type.dtype.is_float:
        return torch.randn(shape, generator=gen).to(type.dtype.to_torch())
    return torch.randint(0, 4, shape, generator=gen).to(type.dtype.to_torch())


def random_data(graph: Graph, bindings: Mapping[str, int] | None = None, seed: int = 0):
    """(inputs, weights) for `graph`: known weight data is kept, the rest is random."""
    gen = torch.Generator().manual_seed(seed)
    bindings = dict(bindings or {})
    for name, (lo, hi) in graph.symbols.items():
        bindings.setdefault(name, min(max(lo, 5), hi or 5))
    inputs = [random_tensor(v.type, bindings, gen) for v in graph.inputs]
    weights = {name: graph.weight_data.get(name, None) for name in graph.weights}
    for name, value in graph.weights.items():
        if weights[name] is None:
            weights[name] = random_tensor(value.type, bindings, gen)
    return inputs, weights


def fuse_text(text: str, pipeline: str = "fuse", weights: Mapping | None = None):
    """(graph after the pipeline, its pass manager) for IR text; the result is verified."""
    graph = parse_ir(textwrap.dedent(text))
    graph.weight_data.update(weights or {})
    manager = PassManager(pipeline)
    graph = manager.run(graph)
    verify(graph)
    return graph, manager


def assert_same_values(text: str, after: Graph, weights: Mapping | None = None,
                       atol: float = 1e-5, seed: int = 0,
                       bindings: Mapping[str, int] | None = None) -> None:
    """`after` computes what the graph in `text` computes, on random data; weights of the same
    name are shared, and `weights` gives the data of weights the pipeline consumed."""
    before = parse_ir(textwrap.dedent(text))
    before.weight_data.update(weights or {})
    inputs, weights = random_data(before, bindings, seed)
    want = run_graph(before, weights, inputs)
    merged = {**after.weight_data, **weights}
    got = run_graph(after, {k: merged[k] for k in after.weights}, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=atol, rtol=atol, equal_nan=True)


def body(graph: Graph) -> str:
    """The IR text without the header lines (symbols, inputs, weights): what a rewrite changed."""
    keep = [line for line in print_ir(graph).splitlines()
            if not line.lstrip().startswith(("symbol ", "input ", "weight ", "graph ", "}"))]
    return "\n".join(line.strip() for line in keep) + "\n"


def ops(graph: Graph) -> list[str]:
    return [node.op for node in graph.nodes]
