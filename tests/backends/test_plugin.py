"""The example plugin in tests/plugin: found through its entry point, compiled for, run.

The plugin is never installed by the test setup: `plugin_site` gives it a distribution's metadata
on sys.path for the discovery test, and the `testplugin` fixture registers it for the others."""

from __future__ import annotations

import importlib.metadata
import json

import numpy as np
import pytest
import torch

import backends
import runtime
from compiler.errors import DayzeroError
from compiler.ir import DType, Graph, TensorType, parse_ir, symbol
from compiler.writer import write_artifact

MLP = """graph main {
  symbol s0 in [1, 32]
  input %x: f32[s0, 3]
  weight @w: f32[4, 3]
  weight @b: f32[4]
  weight @x: f32[4]
  %h: f32[s0, 4] = linear(%x, @w, @b)
  %r: f32[s0, 4] = relu(%h)
  %y: f32[s0, 4] = mul(%r, @x)
  %z: f32[s0, 4] = sub(%y, %h)
  return %z, %r
}
"""


def mlp() -> Graph:
    g = parse_ir(MLP)
    gen = torch.Generator().manual_seed(0)
    g.weight_data = {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(4, generator=gen),
                     "x": torch.randn(4, generator=gen)}
    return g


def eager(g: Graph, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = g.weight_data
    h = torch.nn.functional.linear(x, w["w"], w["b"])
    r = torch.relu(h)
    return r * w["x"] - h, r


def test_found_through_its_entry_point(plugin_site):
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="dayzero.backends")}
    assert eps.get("testplugin") == "dayzero_testplugin:NumpyBackend"
    assert "testplugin" in backends.available()
    backend = backends.get("testplugin")
    assert backend.name == "testplugin"
    assert backend.capabilities().ops == {"add", "sub", "mul", "neg", "exp", "tanh", "relu",
                                          "matmul", "linear"}


def test_compile_and_run(tmp_path, testplugin):
    g = mlp()
    out = write_artifact(tmp_path / "m.dz", g, "testplugin")
    program = json.loads((out / "backend" / "program.json").read_text())
    assert [s["op"] for s in program["steps"]] == ["linear", "relu", "mul", "sub"]
    assert program["steps"][2]["inputs"] == ["%r", "@x"]  # weight @x and input %x stay apart
    m = runtime.load(out)
    assert m.backend.name == "testplugin"
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    for got, want in zip(m(x), eager(g, x)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def test_options_reach_lower_and_the_manifest(tmp_path, testplugin):
    g = mlp()
    m = runtime.load(write_artifact(tmp_path / "m.dz", g, "testplugin", options={"scale": 2.0}))
    assert m.manifest["backend_options"] == {"scale": 2.0}
    x = torch.ones(2, 3)
    np.testing.assert_allclose(m(x)[0], 2 * eager(g, x)[0].numpy(), rtol=1e-5, atol=1e-6)


def test_unsupported_op_is_refused_at_lower(tmp_path, testplugin):
    g = Graph()
    g.symbols["s0"] = (1, 4)
    x = g.add_input("x", TensorType(DType.f32, (symbol("s0"),)))
    g.outputs = [g.add_node("sigmoid", [x]).output]
    assert not backends.get("testplugin").supports(g.nodes[0])
    with pytest.raises(DayzeroError, match="testplugin cannot run sigmoid"):
        write_artifact(tmp_path / "m.dz", g, "testplugin")
    assert list(tmp_path.iterdir()) == []
