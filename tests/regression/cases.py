"""The regression cases: fixed text-only, image-only and mixed inputs for the example models.

Each case names an example SPEC and builds its inputs deterministically; `make_references.py`
stores the inputs and torch eager's outputs in data/<case>.npz, and `test_regression.py` runs
every installed backend that supports the model on the stored inputs against the stored outputs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"regression_{name}",
                                                  ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text() -> tuple:
    generator = torch.Generator().manual_seed(11)
    return (torch.randint(0, 256, (1, 12), generator=generator),)


def _image() -> tuple:
    return (torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(12)),)


def _mixed() -> tuple:
    llava = _example("llava")
    return llava.prompt(5, 7, seed=13), llava.image(seed=14)


@dataclass(frozen=True)
class Case:
    name: str
    spec: str  # examples/<file>.py:<function>, relative to the repository root
    inputs: Callable[[], tuple]

    @property
    def path(self) -> Path:
        return DATA / f"{self.name}.npz"

    @property
    def spec_path(self) -> str:
        return str(ROOT / self.spec)


CASES = [
    Case("text_llama", "examples/llama.py:build", _text),
    Case("image_vit", "examples/vit.py:build", _image),
    Case("mixed_llava", "examples/llava.py:build", _mixed),
]
