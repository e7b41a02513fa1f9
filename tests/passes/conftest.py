"""Shared helpers for pass tests: IR text in, one configured pass, verified graph out."""

from __future__ import annotations

import textwrap

import pytest

from compiler.ir import parse_ir, verify
from passes import parse_pipeline


def _run(text: str, spec: str, weights: dict | None = None):
    graph = parse_ir(textwrap.dedent(text))
    graph.weight_data.update(weights or {})
    (pass_,) = parse_pipeline(spec)
    result = pass_.run(graph)
    verify(result.graph)
    return result


@pytest.fixture
def run_pass():
    """run_pass(ir_text, "pass{opt=value}", weights=None) -> PassResult of a verified graph."""
    return _run
