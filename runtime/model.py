"""CompiledModel: a verified artifact, its backend's executable, and input validation around it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import backends
from compiler.errors import DayzeroError
from compiler.ir import DType

from .artifact import Artifact, open_artifact
from .convert import to_numpy
from .specs import TensorSpec, specs_from_manifest
from .validate import validate_inputs


class CompiledModel:
    """Call it with numpy arrays or torch tensors in input order; get a tuple of numpy arrays."""

    def __init__(self, artifact: Artifact):
        self.artifact = artifact
        self.input_specs: list[TensorSpec] = specs_from_manifest(artifact.manifest, "inputs")
        self.output_specs: list[TensorSpec] = specs_from_manifest(artifact.manifest, "outputs")
        self.backend = _backend_for(artifact)
        self._executable = self.backend.load(artifact)

    @property
    def path(self) -> Path:
        return self.artifact.root

    @property
    def manifest(self) -> dict[str, Any]:
        return self.artifact.manifest

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.input_specs)
        outs = ", ".join(str(s) for s in self.output_specs)
        return (f"CompiledModel({str(self.path)!r}, backend={self.backend.name!r}, "
                f"({ins}) -> ({outs}))")

    def __call__(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        arrays = [np.ascontiguousarray(to_numpy(x)) for x in inputs]
        validate_inputs(self.input_specs, arrays)
        outputs = tuple(to_numpy(y) for y in self._executable(arrays))
        self._check_outputs(outputs)
        return outputs

    def _check_outputs(self, outputs: tuple[np.ndarray, ...]) -> None:
        """A backend returning the wrong number or dtype of outputs is a backend bug, not user's."""
        if len(outputs) != len(self.output_specs):
            raise RuntimeError(f"backend {self.backend.name} returned {len(outputs)} outputs, "
                               f"the model has {len(self.output_specs)}")
        for spec, out in zip(self.output_specs, outputs):
            if out.dtype != _numpy_dtype(spec.dtype):
                raise RuntimeError(f"backend {self.backend.name} returned {out.dtype} for output "
                                   f"'{spec.name}', which is {spec.dtype}")


def load(path: str | Path, verify: str = "full") -> CompiledModel:
    """Open, verify and load the artifact at `path`; runs no code stored in it.

    `verify="size"` skips hashing the weight files (their sizes and headers are still checked).
    A partitioned artifact (several ranks) gives a `runtime.distributed` model instead: this
    rank's part inside a torch.distributed job, else one that launches its ranks on each call.
    """
    from .distributed import load_partitioned, partitioned_world

    if partitioned_world(path) > 1:
        return load_partitioned(path, verify=verify)
    return CompiledModel(open_artifact(path, verify=verify))


def _backend_for(artifact: Artifact) -> backends.Backend:
    try:
        return backends.get(artifact.backend)
    except DayzeroError as exc:
        raise DayzeroError(f"artifact {artifact.root} was compiled for backend "
                           f"'{artifact.backend}', which cannot be used here: {exc.what}",
                           str(artifact.root), exc.fix) from exc


def _numpy_dtype(dtype: str) -> np.dtype:
    return DType(dtype).to_numpy()
