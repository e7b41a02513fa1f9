"""Resolves a command-line SPEC into (module, example_inputs, dynamic_shapes).

A SPEC is `path/to/file.py:function` — the user's own code, which the user asked to run — or a
checkpoint directory in the Hugging Face layout. Every way a SPEC can be wrong gets a message
naming the file or function and what the function must return.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DayzeroError

_RETURN_SHAPE = "(module, example_inputs) or (module, example_inputs, dynamic_shapes)"


@dataclass
class ModelSpec:
    module: Any
    example_inputs: tuple
    dynamic_shapes: Any
    source: str
    checkpoint: Any = None  # a compiler.checkpoint.Checkpoint when SPEC is a checkpoint folder


def load_spec(spec: str, seq_range: tuple[int, int] | None = None) -> ModelSpec:
    """The model a SPEC names; `seq_range` bounds a checkpoint's dynamic sequence length."""
    if Path(spec).is_dir():
        return _load_checkpoint(spec, seq_range)
    path_text, _, function = spec.rpartition(":") if ":" in spec else (spec, "", "")
    path = Path(path_text or spec)
    if not function or path.suffix != ".py":
        raise DayzeroError(f"SPEC '{spec}' is not of the form path/to/file.py:function", spec,
                           "name a Python file and a function in it, e.g. examples/mlp.py:build")
    if not path.is_file():
        raise DayzeroError(f"SPEC file {path} does not exist", spec, "check the path")
    with _importable_beside(path):  # a SPEC file imports the modules next to it
        module = _import_file(path)
        builder = getattr(module, function, None)
        if not callable(builder):
            names = sorted(n for n, v in vars(module).items()
                           if callable(v) and not n.startswith("_"))
            raise DayzeroError(f"{path} has no function '{function}'", spec,
                               f"functions there: {', '.join(names) or 'none'}")
        try:
            result = builder()
        except Exception as exc:
            raise DayzeroError(f"{spec} raised {type(exc).__name__}: {exc}",
                               _user_frame(exc, path), "fix the function; run it directly with "
                               "--debug for the traceback") from exc
    return _check_result(result, spec)


@contextmanager
def _importable_beside(path: Path) -> Iterator[None]:
    """The SPEC file's folder first on sys.path while it is imported and its function runs,
    as `python file.py` would have it."""
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def _load_checkpoint(spec: str, seq_range: tuple[int, int] | None) -> ModelSpec:
    """A Hugging Face checkpoint folder: its model built on meta, weights bound at compile."""
    from .checkpoint import open_checkpoint

    ckpt = open_checkpoint(spec, seq_range=seq_range)
    return ModelSpec(ckpt.module, ckpt.example_inputs, ckpt.dynamic_shapes, spec, ckpt)


def _import_file(path: Path):
    name = f"_dayzero_spec_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise DayzeroError(f"importing {path} raised {type(exc).__name__}: {exc}",
                           _user_frame(exc, path), "fix the file") from exc
    return module


def _user_frame(exc: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() == path.resolve()]
    frame = frames[-1] if frames else None
    return f"{frame.filename}:{frame.lineno}" if frame else str(path)


def _check_result(result: Any, spec: str) -> ModelSpec:
    import torch

    if not isinstance(result, tuple):
        raise DayzeroError(f"{spec} returned {type(result).__name__}, not a tuple", spec,
                           f"return {_RETURN_SHAPE}")
    if len(result) not in (2, 3):
        raise DayzeroError(f"{spec} returned a tuple of {len(result)} item(s), not 2 or 3", spec,
                           f"return {_RETURN_SHAPE}")
    module, inputs, *rest = result
    if not isinstance(module, torch.nn.Module):
        raise DayzeroError(f"{spec} returned {type(module).__name__} as the model", spec,
                           f"return a torch.nn.Module first: {_RETURN_SHAPE}")
    from .hf_models import is_pretrained, wrap_pretrained

    if is_pretrained(module) and isinstance(inputs, (tuple, Mapping)):
        module, inputs = wrap_pretrained(module, inputs, spec)
    if not isinstance(inputs, tuple):
        raise DayzeroError(f"{spec} returned example inputs of type {type(inputs).__name__}", spec,
                           f"return the example inputs as a tuple: {_RETURN_SHAPE}")
    return ModelSpec(module, inputs, rest[0] if rest else None, spec)
