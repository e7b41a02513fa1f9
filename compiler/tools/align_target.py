"""What `dayzero align` compares: an artifact, and the reference graph it is checked against.

- From a SPEC: export the model (the reference graph, before any pass), compile a copy with the
  chosen backend, config and passes into a temporary artifact (or take a given `artifact`
  compiled elsewhere, e.g. from another version of the model or its preprocessing), and keep
  the torch module to check the reference itself against eager. Without passes from the caller
  or the config, the plain cleanup pipeline is used rather than the backend's fusing one, so
  every intermediate value can be compared; `--passes` aligns the fused graph (fused values are
  compared with the regions they replaced).
- From an ARTIFACT: its own graph and weights are the reference.
"""

from __future__ import annotations

import functools
import inspect
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import DayzeroError
from compiler.ir import Graph, parse_ir, print_ir
from compiler.log import SILENT, StageLog

from .align import AlignReport, align_graphs


@dataclass
class AlignTarget:
    artifact: Any  # runtime.Artifact
    compiled: Graph
    reference: Graph
    reference_weights: Mapping[str, Any]
    reference_label: str
    example_inputs: list[np.ndarray] | None = None
    module: Any = None  # the torch module, for the reference-vs-eager check
    _tmp: tempfile.TemporaryDirectory | None = None

    @property
    def input_specs(self):
        from runtime.specs import specs_from_manifest

        return specs_from_manifest(self.artifact.manifest, "inputs")

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> AlignTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def target_from_artifact(path: str | Path) -> AlignTarget:
    """Align an artifact's backend against its own graph on the reference interpreter."""
    artifact = _open(path)
    graph = parse_ir(artifact.graph_text(), source=f"{path}/graph.dzir")
    import torch

    from backends.base import with_sources

    weights = with_sources(artifact.weights("torch"), artifact.manifest.get("derived_weights"),
                           torch.from_numpy)
    return AlignTarget(artifact, graph, graph, weights,
                       f"reference interpreter on {path}/graph.dzir")


def target_from_spec(spec, backend: str = "onnxruntime", config: Any = None,
                     passes: str | None = None, artifact: str | Path | None = None,
                     log: StageLog = SILENT, reference: Graph | None = None,
                     fallback: str | None = None,
                     backend_options: Mapping[str, Any] | None = None) -> AlignTarget:
    """Export `spec` (a `compiler.spec.ModelSpec`) and compile it, or take `artifact`.

    `reference`, when given, is the spec's exported graph (left unchanged), to export once for
    several alignments; `fallback` is `compile --fallback`; `backend_options` are merged over
    the config's, as `compile --backend-option`."""
    from compiler.frontend import export

    if reference is None:
        with log.stage("export"):
            reference = export(spec.module, spec.example_inputs,
                               dynamic_shapes=spec.dynamic_shapes)
    tmp = None
    if artifact is None:
        tmp = tempfile.TemporaryDirectory(prefix="dayzero-align-")
        artifact = _compile(_copy(reference), Path(tmp.name) / "model.dz", backend, config,
                            passes, fallback, log, backend_options)
    try:
        opened = _open(artifact)
        compiled = parse_ir(opened.graph_text(), source=f"{artifact}/graph.dzir")
    except BaseException:
        if tmp is not None:
            tmp.cleanup()
        raise
    examples = [_array(x) for x in spec.example_inputs]
    return AlignTarget(opened, compiled, reference, reference.weight_data,
                       f"reference interpreter on the export of {spec.source}", examples,
                       spec.module, tmp)


def _copy(graph: Graph) -> Graph:
    """An independent graph (passes change theirs in place) sharing the weight tensors."""
    copy = parse_ir(print_ir(graph))
    copy.weight_data = dict(graph.weight_data)
    return copy


def _compile(graph: Graph, out: Path, backend: str, config: Any, passes: str | None,
             fallback: str | None, log: StageLog,
             backend_options: Mapping[str, Any] | None) -> Path:
    import backends
    from compiler.config import load_config
    from compiler.driver import _refuse_unimplemented, lower_and_write
    from passes import DEFAULT_PIPELINE

    cfg = load_config(config).with_backend_options(backend_options, "--backend-option")
    _refuse_unimplemented(cfg)
    if any(v > 1 for v in cfg.parallel.values()):
        raise DayzeroError("align runs one process; the config asks for a parallel layout",
                           "config parallel:", "align without the parallel section")
    passes = passes or (None if cfg.passes else DEFAULT_PIPELINE)
    return lower_and_write(graph, out, backends.get(backend), cfg, passes=passes, dump_ir=None,
                           force=False, log=log, fallback=fallback)


def _open(path: str | Path):
    from runtime import open_artifact
    from runtime.distributed import partitioned_world

    if partitioned_world(path) > 1:
        raise DayzeroError(f"{path} is partitioned over several ranks", str(path),
                           "align the single-rank artifact (compile without parallel:)")
    return open_artifact(path)


def _array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def run_alignment(target: AlignTarget, inputs: Sequence[np.ndarray], atol: float | None = None,
                  rtol: float | None = None,
                  session: Mapping[str, Any] | None = None) -> AlignReport:
    """Run the target's backend and the reference on `inputs` and compare them; `session`
    overrides recorded session settings as in `runtime.load` (backends that take them)."""
    import backends
    from runtime.validate import validate_inputs

    arrays = [np.asarray(x, order="C") for x in inputs]  # 0-d stays 0-d
    validate_inputs(target.input_specs, arrays)
    backend = backends.get(target.artifact.backend)
    names = [v.name for node in target.compiled.nodes for v in node.outputs]
    observer = None
    if not session or _takes_session(backend.observe):  # else: outputs only, from `load`
        observer = _with_session(backend.observe, backend.name, session)(target.artifact, names)
    outputs_only = observer is None
    if outputs_only:
        executable = _with_session(backend.load, backend.name, session)(target.artifact)
        observer = lambda xs: (list(executable(xs)), {})  # noqa: E731
    report = align_graphs(target.compiled, target.reference, target.reference_weights, observer,
                          arrays, backend=backend.name, reference_label=target.reference_label,
                          atol=atol, rtol=rtol, outputs_only=outputs_only)
    if target.module is not None:
        report.eager_max_abs = eager_difference(target.module, arrays, report.reference_outputs)
    return report


def _with_session(method, backend: str, session: Mapping[str, Any] | None):
    """`method` (a backend's load or observe) with the session overrides bound, for a method
    that takes them; without overrides, the method as it is."""
    if not session:
        return method
    if not _takes_session(method):
        raise DayzeroError(f"backend '{backend}' has no session settings to override",
                           "--session", "align without --session")
    return functools.partial(method, session=session)


def _takes_session(method) -> bool:
    return "session" in inspect.signature(method).parameters


def eager_difference(module, inputs: Sequence[np.ndarray],
                     reference_outputs: Sequence[np.ndarray]) -> float | None:
    """Max abs difference of the reference graph's outputs from the torch module's (None when
    the module refuses the inputs, e.g. random ids without LLaVA's image tokens, or its outputs
    do not line up with the graph's)."""
    import torch
    import torch.utils._pytree as pytree

    try:
        with torch.no_grad():
            eager = pytree.tree_leaves(module(*[torch.from_numpy(np.array(x)) for x in inputs]))
    except Exception:  # the module's own checks may refuse inputs the graph accepts
        return None
    if len(eager) != len(reference_outputs):
        return None
    diffs = []
    for ref, tensor in zip(reference_outputs, eager):
        got = _array(tensor)
        if ref.shape != got.shape:
            return None
        diffs.append(float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64)),
                                  initial=0.0)))
    return max(diffs, default=0.0)
