"""The reference backend: runs the IR op by op with each op's torch reference semantics.

It is the golden model other backends are checked against, so it lowers to nothing: the graph text
and the weights are its whole payload. Loading parses graph.dzir and maps the weights as torch
tensors straight from the safetensors files (no copy), then runs `interpreter.run_graph` — or,
when the artifact records a memory plan (`plan_memory` in the pipeline), `arena.run_in_arena`,
which allocates one arena per run and keeps every intermediate at its planned offset.
torch is imported only when a graph runs, so listing capabilities works without it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from compiler.errors import ArtifactError, DayzeroError
from compiler.ir import OPS, DType, Graph, parse_ir

from ..base import ArtifactView, Backend, Capabilities, Executable, WeightLocation

# dtypes numpy has no native type for -> torch integer dtype of the same width (moved as bits)
_RAW_BITS = {DType.bf16: "int16", DType.f8e4m3: "uint8", DType.f8e5m2: "uint8"}


class ReferenceBackend(Backend):
    name = "reference"

    def capabilities(self) -> Capabilities:
        return Capabilities(ops=frozenset(OPS), dtypes=frozenset(d.value for d in DType),
                            symbolic_shapes=True)

    def lower(self, graph: Graph, weights: Mapping[str, WeightLocation],
              options: Mapping[str, Any]) -> dict[str, bytes]:
        if options:
            raise DayzeroError(f"the reference backend takes no options, got {sorted(options)}",
                                "backend options", "remove the backend options")
        return {}

    def load(self, artifact: ArtifactView) -> Executable:
        graph = parse_ir(artifact.graph_text(), source=f"{artifact.root}/graph.dzir")
        weights = artifact.weights("torch")
        check_weights(graph, weights, str(artifact.root))
        return _Executable(graph, weights, _layout(artifact, graph))


def _layout(artifact: ArtifactView, graph: Graph):
    """The arena layout of the artifact's memory plan, or None when it records none."""
    plan = artifact.manifest.get("memory_plan")
    if plan is None:
        return None
    from .arena import ArenaLayout

    where = f"{artifact.root}/manifest.json: memory_plan"
    layout = ArenaLayout.from_plan(plan, where)
    layout.check_graph(graph, where)
    return layout


def check_weights(graph: Graph, weights: Mapping[str, Any], where: str) -> None:
    """Every weight the graph declares is stored, with the declared dtype and shape."""
    for name, value in graph.weights.items():
        if name not in weights:
            raise ArtifactError(f"weight '{name}' is declared in graph.dzir but not stored",
                                where, "the artifact is corrupted; recompile it")
        tensor = weights[name]
        dtype, shape = DType.from_torch(tensor.dtype), tuple(tensor.shape)
        if dtype != value.type.dtype or shape != value.type.shape:
            raise ArtifactError(f"weight '{name}' is stored as {dtype}{list(shape)} but declared "
                                f"{value.type}", where, "the artifact is corrupted; recompile it")


class _Executable:
    """Runs the graph; with a memory plan, in one arena, keeping the last run's `ArenaStats`."""

    def __init__(self, graph: Graph, weights: Mapping[str, Any], layout=None):
        self.graph = graph
        self.weights = weights
        self.layout = layout
        self.last_stats = None

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        tensors = [_to_torch(x) for x in inputs]
        if self.layout is None:
            from .interpreter import run_graph

            outputs = run_graph(self.graph, self.weights, tensors)
        else:
            from .arena import run_in_arena

            outputs, self.last_stats = run_in_arena(self.graph, self.weights, tensors,
                                                    self.layout)
        return [_to_numpy(t) for t in outputs]


def _to_torch(x: Any):
    import numpy as np
    import torch

    if isinstance(x, np.ndarray):
        dtype = DType.from_numpy(x.dtype)
        if dtype in _RAW_BITS:
            bits = np.asarray(x, order="C").view(getattr(np, _RAW_BITS[dtype]))
            return torch.from_numpy(bits).view(dtype.to_torch())
        with warnings.catch_warnings():  # read-only arrays are fine: ops never write inputs
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(x)
    return torch.as_tensor(x)


def _to_numpy(t):
    import torch

    t = t.detach().cpu().resolve_conj().resolve_neg()
    dtype = DType.from_torch(t.dtype)
    if dtype in _RAW_BITS:
        bits = t.contiguous().view(getattr(torch, _RAW_BITS[dtype])).numpy()
        return bits.view(dtype.to_numpy())
    return t.numpy()
