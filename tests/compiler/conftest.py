"""Fixtures of the compiler and CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.cli import main

MLP = f"{Path(__file__).resolve().parents[2]}/examples/mlp.py:build"


@pytest.fixture(scope="module")
def mlp_artifact(tmp_path_factory) -> Path:
    """examples/mlp.py compiled on the reference backend (input `input` f32[s0, 32], s0 the Dim
    `batch`), once per test module."""
    out = tmp_path_factory.mktemp("cli") / "mlp.dz"
    assert main(["compile", MLP, "-o", str(out), "--backend", "reference"]) == 0
    return out
