"""CompiledModel: a verified artifact, its backend's executable, and input validation around it."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import backends
from compiler.errors import DayzeroError, InputError
from compiler.ir.dtypes import DType

from .artifact import Artifact, open_artifact
from .specs import TensorSpec
from .to_numpy import to_numpy
from .validate import check_output_shapes, prepare_inputs


class CompiledModel:
    """Call it with numpy arrays or torch tensors in input order; get a tuple of numpy arrays."""

    def __init__(self, artifact: Artifact, *, session: Mapping[str, Any] | None = None):
        self.artifact = artifact
        self.input_specs: list[TensorSpec] = list(artifact.typed.inputs)
        self.output_specs: list[TensorSpec] = list(artifact.typed.outputs)
        self.index_ranges = dict(artifact.typed.index_inputs)
        self.backend = _backend_for(artifact)
        self._output_dtypes = [_numpy_dtype(spec.dtype) for spec in self.output_specs]
        view = _CheckedView(artifact, self)
        if artifact.manifest.get("memory_plan") is not None:
            view.check()  # the plan is checked against the graph whatever the backend reads
        self._executable = _load_executable(self.backend, view, session)
        if not view.checked:  # the backend runs its own payload: the manifest is still checked
            self.index_ranges = artifact.check_consistency(self.input_specs, self.output_specs)

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

    def describe(self) -> str | None:
        """What the backend reports about this load (onnxruntime: the session settings as
        applied on this machine), or None when it reports nothing."""
        describe = getattr(self._executable, "describe", None)
        return describe() if callable(describe) else None

    def __call__(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        arrays, values = prepare_inputs(self.input_specs, inputs, self.index_ranges)
        return self._run(arrays, values)

    def with_fixed_inputs(self, fixed: Mapping[str, Any]) -> FixedInputsModel:
        """This model with the inputs named in `fixed` bound once: they are validated now, and
        each call passes (by name) and validates only the others. For inputs passed unchanged
        call after call, such as a generation step's KV-cache pools: their arrays may change
        in place, never in shape or dtype."""
        return FixedInputsModel(self, fixed)

    def _run(self, arrays: list[np.ndarray], values: dict[str, int]) -> tuple[np.ndarray, ...]:
        outputs = tuple(to_numpy(y) for y in self._executable(arrays))
        self._check_outputs(outputs)
        check_output_shapes(self.output_specs, outputs, values, f"backend {self.backend.name}")
        return outputs

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Only a generation artifact generates; this one says how to compile one."""
        raise InputError(f"{self.path} was compiled for task forward: it has no KV-cached step "
                         "to generate with", str(self.path),
                         "compile it with --task text-generation (compiler.compile(..., "
                         "task='text-generation'))")

    stream = generate_text = generate

    def _check_outputs(self, outputs: tuple[np.ndarray, ...]) -> None:
        """A backend returning the wrong number or dtype of outputs is a backend bug, not user's."""
        if len(outputs) != len(self.output_specs):
            raise RuntimeError(f"backend {self.backend.name} returned {len(outputs)} outputs, "
                               f"the model has {len(self.output_specs)}")
        for spec, out, dtype in zip(self.output_specs, outputs, self._output_dtypes):
            if out.dtype != dtype:
                raise RuntimeError(f"backend {self.backend.name} returned {out.dtype} for output "
                                   f"'{spec.name}', which is {spec.dtype}")


class FixedInputsModel:
    """`CompiledModel.with_fixed_inputs`: some inputs validated once, the rest per call."""

    def __init__(self, model: CompiledModel, fixed: Mapping[str, Any]):
        names = [spec.name for spec in model.input_specs]
        unknown = sorted(set(fixed) - set(names))
        if unknown:
            raise InputError(f"the model has no input(s) {', '.join(unknown)}", "fixed inputs",
                             f"its inputs are {', '.join(names)}")
        self.model = model
        fixed_specs = [s for s in model.input_specs if s.name in fixed]
        arrays, self._known = prepare_inputs(fixed_specs, [fixed[s.name] for s in fixed_specs],
                                             model.index_ranges)
        self._fixed = {spec.name: array for spec, array in zip(fixed_specs, arrays)}
        self.free_specs = [s for s in model.input_specs if s.name not in fixed]

    def __call__(self, **inputs: Any) -> tuple[np.ndarray, ...]:
        missing = [s.name for s in self.free_specs if s.name not in inputs]
        extra = sorted(set(inputs) - {s.name for s in self.free_specs})
        if missing or extra:
            raise InputError(f"missing input(s) {missing}, unexpected {extra}", "model inputs",
                             f"pass exactly {', '.join(s.name for s in self.free_specs)}")
        arrays, values = prepare_inputs(self.free_specs, [inputs[s.name] for s in
                                                          self.free_specs],
                                        self.model.index_ranges, self._known)
        given = dict(zip((s.name for s in self.free_specs), arrays))
        ordered = [given[s.name] if s.name in given else self._fixed[s.name]
                   for s in self.model.input_specs]
        return self.model._run(ordered, values)


class _CheckedView:
    """The artifact as its backend sees it: graph.dzir is parsed and checked (it verifies, the
    specs and index ranges are its own, a memory plan is sound) before the backend first reads
    it. Parsing a large graph takes seconds, so backends that never read it (onnxruntime runs
    its ONNX payload) do not pay for it; they rely on the index ranges the manifest records.
    """

    def __init__(self, artifact: Artifact, model: CompiledModel):
        self._artifact, self._model, self.checked = artifact, model, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._artifact, name)

    def check(self) -> None:
        if not self.checked:
            # the IR parser and verifier (sympy, lark, the op table) load only for artifacts
            # whose graph is read: an ONNX Runtime artifact without a memory plan runs without
            from .graph_checks import check_artifact_graph

            model = self._model
            model.index_ranges = check_artifact_graph(self._artifact, model.input_specs,
                                                      model.output_specs)
            self.checked = True

    def graph_text(self, *args: Any, **kwargs: Any) -> str:
        self.check()
        return self._artifact.graph_text(*args, **kwargs)


def load(path: str | Path, verify: str = "full", *,
         session: Mapping[str, Any] | None = None, timeout: float | None = None,
         kv_cache_memory: int | str | None = None):
    """Open, verify and load the artifact at `path`; runs no code stored in it.

    `verify="size"` skips hashing the weight files (their sizes and headers are still checked).
    `session` overrides the session settings recorded at compile time for this run, e.g.
    `{"allow_spinning": False, "intra_op_threads": 2}`: threads and spinning belong to the
    machine that runs the model (onnxruntime artifacts; other backends refuse it).
    A partitioned artifact (several ranks) gives a `runtime.distributed` model instead: this
    rank's part inside a torch.distributed job, else one that launches its ranks on each call.
    `timeout` is then the seconds a collective waits for its peers (default 300), also inside
    torchrun: it reaches the process group's initialisation. A single-rank artifact has no
    collectives and ignores it.
    A generation artifact gives a `runtime.generation.GenerationModel` (`generate`, `stream`,
    `generate_text`); `kv_cache_memory` (bytes or "2GiB") overrides its compiled cache size.
    An artifact compiled at several static sizes of one dim (the manifest's `static_sizes`)
    gives a `runtime.sized.SizedModel`, which runs the size the inputs have.
    """
    from .distributed import load_partitioned, partitioned_world

    if partitioned_world(path) > 1:
        from .distributed import read_manifest

        manifest = read_manifest(Path(path))
        if manifest.get("generation") is not None and not session:
            from .generation.ranks import load_tensor_parallel
            from .generation.spec import GenerationSpec, checked_cache_memory

            cache = _cache_memory(kv_cache_memory)
            # before the ranks start: each allocates its share of the pool at once
            checked_cache_memory(GenerationSpec.from_manifest(manifest["generation"],
                                                              str(path)), cache)
            return load_tensor_parallel(path, manifest, verify=verify, timeout=timeout,
                                        kv_cache_memory=cache)
        if session:
            raise DayzeroError("session settings cannot be overridden for a partitioned "
                               "artifact yet", str(path),
                               "compile with backend_options session settings instead")
        return load_partitioned(path, verify=verify, timeout=timeout)
    model = CompiledModel(open_artifact(path, verify=verify), session=session)
    if model.manifest.get("static_sizes") is not None:
        from .sized import SizedModel

        return SizedModel(model, verify, session,
                          lambda artifact, ses: CompiledModel(artifact, session=ses))
    if model.manifest.get("generation") is None:
        return model
    from .generation.model import GenerationModel

    return GenerationModel(model, kv_cache_memory=_cache_memory(kv_cache_memory))


def _cache_memory(kv_cache_memory: int | str | None) -> int | None:
    from .generation.spec import parse_bytes

    return None if kv_cache_memory is None else parse_bytes(kv_cache_memory, "kv_cache_memory")


def _load_executable(backend: backends.Backend, artifact: Artifact,
                     session: Mapping[str, Any] | None):
    """`backend.load`, with the session overrides for a backend whose `load` takes them (an
    optional keyword: backends without session settings keep the plain signature)."""
    if not session:
        return backend.load(artifact)
    if "session" not in inspect.signature(backend.load).parameters:
        raise DayzeroError(f"backend '{backend.name}' has no session settings to override",
                           str(artifact.root), "load this artifact without session settings")
    return backend.load(artifact, session=session)


def _backend_for(artifact: Artifact) -> backends.Backend:
    try:
        return backends.get(artifact.backend)
    except DayzeroError as exc:
        raise DayzeroError(f"artifact {artifact.root} was compiled for backend "
                           f"'{artifact.backend}', which cannot be used here: {exc.what}",
                           str(artifact.root), exc.fix) from exc


def _numpy_dtype(dtype: str) -> np.dtype:
    return DType(dtype).to_numpy()
