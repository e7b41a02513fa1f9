"""The benchmark scripts under test: scripts, not a package, so each test loads one by path."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def benchmark_script(name: str) -> Iterator[ModuleType]:
    """benchmarks/<name>.py loaded as module `bench_<name>`, registered in sys.modules while it
    is in use (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
