"""The on-disk cache of compiled graphs, so a second process starts warm.

The key covers everything the artifact depends on: the graph's code, each input's dtype and
shape (dynamic dims by name), the weights' values (a model with other weights must not get this
one's artifact), the options, and the versions of dayzero, torch and onnxruntime. Artifacts are
written by `compiler.compile` (atomically: a half-written one is never seen) under the per-user
cache folder, and `runtime.load` verifies each file's hash on load like any artifact.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from backends.user_cache import user_cache_dir

from .graph_module import Prepared

_VERSIONED = ("dayzero", "torch", "onnxruntime", "triton")


def cache_key(prepared: Prepared, options: Mapping[str, Any]) -> str:
    digest = hashlib.sha256()
    digest.update(prepared.module.code.encode())
    for x, dims in zip(prepared.example_inputs, prepared.dynamic_shapes):
        shape = ["*" if dims and d in dims else n for d, n in enumerate(x.shape)]
        digest.update(f"{x.dtype}{shape}".encode())
    for w in prepared.weights:
        data = w.detach().cpu().contiguous()
        digest.update(f"{data.dtype}{tuple(data.shape)}".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy())
    digest.update(json.dumps(options, sort_keys=True, default=str).encode())
    digest.update(json.dumps(_versions()).encode())
    return digest.hexdigest()


def artifact_path(key: str, folder: str | None = None) -> Path:
    return user_cache_dir("torch_compile", folder) / key[:40] / "model.dz"


def _versions() -> dict[str, str]:
    found = {}
    for name in _VERSIONED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "-"
    return found
