"""The runtime and the registry work where torch is not installed (as for ONNX Runtime artifacts).

A subprocess installs an import hook that makes every `import torch` fail, as on a machine without
torch, then imports the runtime and runs an artifact made for a numpy-only backend plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import torch

from compiler.ir import DType, Graph, TensorType, symbol
from compiler.writer import write_artifact

BLOCK_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked in this test ({name})")
            return None

    sys.meta_path.insert(0, NoTorch())
""")


def run_without_torch(code: str, path: list[str] = ()) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter where torch cannot be imported; `path` goes in front of
    its PYTHONPATH (the `plugin_site` folders, so the example plugin is found as installed)."""
    script = BLOCK_TORCH + textwrap.dedent(code)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env)


def test_the_blocker_blocks():
    result = run_without_torch("import torch")
    assert result.returncode != 0 and "torch is blocked" in result.stderr


def test_import_runtime_and_backends_without_torch(plugin_site):
    result = run_without_torch(path=plugin_site, code="""
        import runtime, backends
        assert "torch" not in sys.modules
        assert not any(m == "passes" or m.startswith(("passes.", "compiler.frontend"))
                       for m in sys.modules), "the runtime must not import the frontend or passes"
        print(",".join(backends.available()))
        print(backends.get("reference").capabilities().ops >= {"linear", "softmax"})
    """)
    assert result.returncode == 0, result.stderr
    names, caps = result.stdout.split()
    assert {"reference", "testplugin"} <= set(names.split(","))
    assert caps == "True"


def test_numpy_only_artifact_runs_without_torch(tmp_path, plugin_site):
    g = Graph()
    g.symbols["s0"] = (1, 16)
    x = g.add_input("x", TensorType(DType.f32, (symbol("s0"), 3)))
    w = g.add_weight("w", TensorType(DType.f32, (2, 3)), torch.randn(2, 3))
    b = g.add_weight("b", TensorType(DType.f32, (2,)), torch.randn(2))
    y = g.add_node("linear", [x, w, b]).output
    g.outputs = [g.add_node("tanh", [y], names=["y"]).output]
    out = write_artifact(tmp_path / "m.dz", g, "testplugin")
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    np.save(tmp_path / "x.npy", x)
    result = run_without_torch(path=plugin_site, code=f"""
        import json, numpy as np, runtime
        m = runtime.load({str(out)!r})
        (y,) = m(np.load({str(tmp_path / "x.npy")!r}))
        assert "torch" not in sys.modules
        print(json.dumps({{"y": y.tolist(), "dtype": str(y.dtype),
                          "spec": str(m.output_specs[0])}}))
    """)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    expected = torch.tanh(torch.nn.functional.linear(torch.from_numpy(x), g.weight_data["w"],
                                                     g.weight_data["b"]))
    assert got["dtype"] == "float32" and got["spec"] == "y: f32[s0, 2]"
    np.testing.assert_allclose(np.array(got["y"]), expected.numpy(), rtol=1e-5, atol=1e-6)
