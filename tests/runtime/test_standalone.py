"""The runtime stands alone: an ONNX Runtime artifact loads and runs where nothing of the compiler
can be imported (docs/runtime-only.md, packaging/runtime).

A fresh interpreter installs an import hook that refuses torch, transformers, the passes, the
compiler's frontend, driver, checkpoint reader, commands, tools and CLI, the reference and triton
backends, and also sympy, lark and onnx (the IR parser's and the lowering's libraries), then loads
and runs an artifact compiled here. What it imported is printed and checked: of `compiler`, only
the vocabulary the artifact shares with it (the error classes, the dtype table and the limits on
untrusted text) and the heap trim that ends a session's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from compiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT}/examples/mlp.py"

BLOCKED = ("torch", "transformers", "passes", "compiler.frontend", "compiler.driver",
           "compiler.checkpoint", "compiler.commands", "compiler.tools", "compiler.cli",
           "backends.reference", "backends.triton", "sympy", "lark", "onnx")

# what the runtime may use of the compiler: leaf modules without imports of their own
SHARED_VOCABULARY = {"compiler", "compiler.errors", "compiler.heap", "compiler.ir",
                     "compiler.ir.dtypes", "compiler.ir.limits"}

FIRST_PARTY = ("compiler", "runtime", "backends", "passes", "dayzero")

# BLOCKED modules fail to import; a first-party module found outside SITE (the developer's
# editable install, say) fails too, so a module missing from SITE cannot be made up elsewhere
BLOCKER = textwrap.dedent("""
    import sys

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"{name} is blocked in this test")
            if name.split(".")[0] not in FIRST_PARTY:
                return None
            for finder in sys.meta_path:
                spec = None if finder is self else finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.origin and not spec.origin.startswith(SITE):
                        raise ImportError(f"{name} is not in {SITE} ({spec.origin})")
                    return spec
            return None

    sys.meta_path.insert(0, Blocker())
""")


def run_blocked(code: str, site: Path = ROOT) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with BLOCKED refused, whose only first-party code is that
    in `site` (this checkout, or a folder the runtime distribution was installed into)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    head = f"BLOCKED, FIRST_PARTY, SITE = {BLOCKED!r}, {FIRST_PARTY!r}, {str(site) + os.sep!r}\n"
    return subprocess.run([sys.executable, "-c", head + BLOCKER + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=site)


@pytest.fixture(scope="module")
def mlp_onnxruntime(tmp_path_factory) -> Path:
    """examples/mlp.py compiled for onnxruntime through the CLI."""
    out = tmp_path_factory.mktemp("standalone") / "mlp.dz"
    assert main(["compile", f"{MLP}:build", "-o", str(out), "--backend", "onnxruntime"]) == 0
    return out


def test_the_blocker_blocks():
    result = run_blocked("""
        for name in BLOCKED:
            try:
                __import__(name)
            except ImportError as exc:
                assert "blocked in this test" in str(exc), exc
            else:
                raise AssertionError(name + " imported")
        import onnxruntime, numpy  # not blocked: "onnx" is not a prefix of "onnxruntime"
        SITE = "/nowhere/"
        try:
            import runtime
        except ImportError as exc:
            assert "runtime is not in /nowhere/" in str(exc), exc
        else:
            raise AssertionError("runtime imported from outside SITE")
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def check_runs_alone(artifact: Path, work: Path, site: Path = ROOT) -> dict:
    """Run `artifact` on a batch of 7 under the blocker with `site` as the only first-party
    code; compare with torch eager (examples/mlp.py) and return what the process reported."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from mlp import build
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model, _, _ = build()
    x = np.random.default_rng(0).standard_normal((7, 32)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.save(work / "x.npy", x)
    result = run_blocked(f"""
        import json, numpy as np, runtime
        from backends.onnxruntime import native_ops

        m = runtime.load({str(artifact)!r})
        (y,) = m(np.load({str(work / "x.npy")!r}))
        np.save({str(work / "y.npy")!r}, y)
        top = sorted({{k.split(".")[0] for k in sys.modules}} - set(sys.stdlib_module_names)
                     - set(sys.builtin_module_names))
        compiler = sorted(k for k in sys.modules if k.split(".")[0] == "compiler")
        print(json.dumps({{"backend": m.backend.name, "top": top, "compiler": compiler,
                          "runtime": runtime.__file__, "native": str(native_ops.library())}}))
    """, site)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"] == "onnxruntime"
    np.testing.assert_allclose(np.load(work / "y.npy"), expected, rtol=1e-5, atol=1e-5)
    assert set(report["compiler"]) == SHARED_VOCABULARY
    first_party = {"compiler", "runtime", "backends", "passes", "dayzero"} & set(report["top"])
    assert first_party == {"compiler", "runtime", "backends"}, report["top"]
    assert {"numpy", "onnxruntime"} <= set(report["top"])
    assert Path(report["runtime"]).is_relative_to(site)
    return report


def test_onnxruntime_artifact_runs_without_the_compiler(mlp_onnxruntime, tmp_path):
    check_runs_alone(mlp_onnxruntime, tmp_path)


@pytest.mark.slow
def test_the_runtime_distribution_runs_it_installed(mlp_onnxruntime, tmp_path):
    """`pip install ./packaging/runtime` into a folder (the native library compiled: about 20
    s), then the same run with that folder as the only first-party code."""
    site = tmp_path / "site"
    env = {**os.environ, "PIP_CONSTRAINT": str(ROOT / "constraints.txt")}
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                             "--no-build-isolation", "--no-compile", "-t", str(site),
                             str(ROOT / "packaging" / "runtime")],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert not (site / "passes").exists() and not (site / "compiler" / "driver.py").exists()
    report = check_runs_alone(mlp_onnxruntime, tmp_path, site)
    assert Path(report["native"]).is_relative_to(site / "backends" / "onnxruntime")
