"""`Capabilities.symbolic_shapes=False` is honoured: such a backend gets static graphs only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

import backends
import compiler
import runtime
from backends.reference import ReferenceBackend
from compiler.errors import DayzeroError
from compiler.ir import parse_ir

STATIC = "static_reference"


class StaticReference(ReferenceBackend):
    """The reference backend, declared as one that needs every dim known at compile time."""

    name = STATIC

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), symbolic_shapes=False)


@pytest.fixture
def static_backend():
    backends.register(STATIC, StaticReference)
    yield
    backends.unregister(STATIC)


def _relu(shape: str):
    symbols = "  symbol s0 in [1, 64]\n" if "s0" in shape else ""
    graph = parse_ir(f"graph g {{\n{symbols}  input %x: f32[{shape}]\n"
                     f"  %y: f32[{shape}] = relu(%x)\n  return %y\n}}\n")
    return graph.nodes[0]


def test_supports_refuses_a_node_with_a_symbolic_dim():
    static = StaticReference()
    assert static.supports(_relu("2, 8"))
    assert not static.supports(_relu("s0, 8"))
    assert ReferenceBackend().supports(_relu("s0, 8"))


def test_compile_refuses_size_symbols_for_a_static_backend(static_backend, tmp_path):
    model, x = nn.Linear(8, 4), torch.randn(3, 8)
    batch = torch.export.Dim("batch", min=2, max=16)
    with pytest.raises(DayzeroError, match=rf"backend '{STATIC}' needs static shapes, but the "
                                           r"graph has size symbols s0 \(input '\w+' dim 0 = s0\)"):
        compiler.compile(model, (x,), out=tmp_path / "m.dz", backend=STATIC,
                         dynamic_shapes=({0: batch},))
    assert not (tmp_path / "m.dz").exists()


def test_a_static_graph_compiles_and_matches_eager(static_backend, tmp_path):
    model, x = nn.Linear(8, 4), torch.randn(3, 8)
    path = compiler.compile(model, (x,), out=tmp_path / "m.dz", backend=STATIC)
    (out,) = runtime.load(path)(x.numpy())
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
