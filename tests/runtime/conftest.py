"""Small graphs with weights, and backends that misbehave on purpose, for the runtime tests."""

from __future__ import annotations

import pytest
import torch

import backends
from backends import Backend, Capabilities
from compiler.ir import OPS, DType, Graph, TensorType, symbol


def mlp_graph(seed: int = 0) -> Graph:
    """x: f32[s0, 4] -> linear(8) -> relu -> linear(3), s0 in [2, 64]."""
    gen = torch.Generator().manual_seed(seed)
    g = Graph()
    g.symbols["s0"] = (2, 64)
    x = g.add_input("x", TensorType(DType.f32, (symbol("s0"), 4)))
    w1 = g.add_weight("w1", TensorType(DType.f32, (8, 4)), torch.randn(8, 4, generator=gen))
    b1 = g.add_weight("b1", TensorType(DType.f32, (8,)), torch.randn(8, generator=gen))
    w2 = g.add_weight("w2", TensorType(DType.f32, (3, 8)), torch.randn(3, 8, generator=gen))
    h = g.add_node("linear", [x, w1, b1]).output
    h = g.add_node("relu", [h]).output
    g.outputs = [g.add_node("linear", [h, w2, None], names=["y"]).output]
    return g


def mlp_eager(g: Graph, x: torch.Tensor) -> torch.Tensor:
    w = g.weight_data
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w["w1"], w["b1"])),
                                      w["w2"])


class RecordingBackend(Backend):
    """Runs nothing; remembers what lower() was given and writes one payload file."""

    name = "recording"
    seen: dict = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(ops=frozenset(OPS))

    def lower(self, graph, weights, options):
        RecordingBackend.seen = {"weights": dict(weights), "options": dict(options)}
        return {"plan/notes.txt": b"hello", "top.bin": bytes(range(7))}

    def load(self, artifact):
        return lambda inputs: []


class FailingBackend(RecordingBackend):
    name = "failing"

    def lower(self, graph, weights, options):
        raise RuntimeError("lowering exploded")


@pytest.fixture
def registered():
    """Registers the test backends above for one test; gives the recording backend's class."""
    backends.register("recording", RecordingBackend)
    backends.register("failing", FailingBackend)
    yield RecordingBackend
    backends.unregister("recording")
    backends.unregister("failing")


@pytest.fixture
def make_mlp():
    """`make_mlp(seed) -> Graph`: the mlp_graph above, with its weights."""
    return mlp_graph


@pytest.fixture
def mlp_reference():
    """`mlp_reference(graph, x) -> tensor`: the MLP in torch eager."""
    return mlp_eager
