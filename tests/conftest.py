"""Fixtures shared by the whole suite. Kept small: per-area helpers live next to their tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

# Triton kernels run in Triton's interpreter without CUDA. The choice must be made before anything
# imports triton (torch.export and transformers do), so it is made here, before any test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from hypothesis import HealthCheck, settings

# pytest puts this folder on sys.path, and its subfolders are named like the packages they test
# (tests/compiler, tests/runtime, ...). The editable install finds packages only after sys.path
# is searched, so those folders would shadow the real packages as namespace packages; with the
# repository root on sys.path the real (regular) packages always win.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from compiler.ir import Graph, parse_ir, print_ir, verify  # noqa: E402

# CI machines are slow and shared: a property test must not fail on timing alone.
settings.register_profile("dayzero", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dayzero")


def _roundtrip(graph_or_text: Graph | str) -> Graph:
    """Print, parse and print again; assert the two texts match and both graphs verify."""
    text = graph_or_text if isinstance(graph_or_text, str) else print_ir(graph_or_text)
    if isinstance(graph_or_text, Graph):
        verify(graph_or_text)
    parsed = parse_ir(text)
    verify(parsed)
    again = print_ir(parsed)
    assert again == text, f"round trip changed the text:\n--- first\n{text}--- second\n{again}"
    return parsed


@pytest.fixture
def roundtrip():
    """`roundtrip(graph or text) -> parsed Graph`; asserts print -> parse -> print is identical."""
    return _roundtrip
