"""`import dayzero`: the public API in one namespace, loaded lazily, at the top of the layering."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import backends
import compiler
import dayzero
import runtime

ROOT = Path(__file__).resolve().parents[1]


def test_names_are_the_packages_own():
    assert dayzero.compile is compiler.compile and dayzero.export is compiler.export
    assert dayzero.load is runtime.load and dayzero.backends is backends
    assert dayzero.ir is compiler.ir
    from compiler.checkpoint import compile_checkpoint

    assert dayzero.compile_checkpoint is compile_checkpoint
    assert dayzero.__version__ == importlib.metadata.version("dayzero")


def test_dir_lists_the_lazy_names_and_unknown_ones_fail():
    assert {"compile", "load", "export", "compile_checkpoint", "ir", "backends",
            "__version__"} <= set(dir(dayzero))
    with pytest.raises(AttributeError, match="module 'dayzero' has no attribute 'compiel'"):
        dayzero.compiel  # noqa: B018


def test_compile_and_load_through_the_facade(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
    x = torch.randn(2, 4)
    path = dayzero.compile(model, (x,), out=tmp_path / "m.dz", backend="reference")
    (y,) = dayzero.load(path)(x)
    np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_import_dayzero_loads_nothing_heavy():
    code = ("import sys, dayzero; heavy = [m for m in ('torch', 'compiler', 'runtime', 'passes') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_package_below_imports_the_facade():
    offenders = []
    for package in ("compiler", "passes", "backends", "runtime"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(n == "dayzero" or n.startswith("dayzero.") for n in names):
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
