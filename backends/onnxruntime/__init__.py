"""The onnxruntime backend: IR -> ONNX (external weights) -> ONNX Runtime on CPU.

The fallback backend that must run every model the frontend accepts, on any machine. Lowering
(`lower`, `op_table`, `fused`) needs the `onnx` package; loading and running (`load`, `session`,
`executable`) need only numpy and onnxruntime, so an artifact runs where torch is not installed.
This module imports neither onnx nor onnxruntime until a method needs them.

Payload (under the artifact's backend/ folder):
  model.onnx      the graph; initializers are external data inside weights/*.safetensors
  lowering.json   opset, session options, fused kernels used, and per IR node the ONNX ops
                  it became (read by `inspection` for `dayzero inspect`)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from backends.base import ArtifactView, Backend, Capabilities, WeightLocation
from compiler.errors import DayzeroError

from .inspection import RECORD, format_node_map, node_map, read_record
from .session import SessionConfig

if TYPE_CHECKING:
    from compiler.ir import Graph, Node

    from .executable import OrtExecutable

MODEL = "model.onnx"
OPTION_KEYS = ("session", "exclude_kernels")
DTYPES = frozenset({"f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool"})

__all__ = ["OnnxRuntimeBackend", "format_node_map", "node_map", "read_record"]


class OnnxRuntimeBackend(Backend):
    """Options (the `options` mapping given to `lower`, stored in the manifest):

    - `session`: overrides of `SessionConfig` fields (threads, optimization level, arena, ...).
    - `exclude_kernels`: ORT kernels to treat as missing, e.g. ["com.microsoft.Gelu"], to
      produce a model for a reduced ORT build that lacks them.
    """

    name = "onnxruntime"

    def capabilities(self) -> Capabilities:
        from .op_table import CONVERTERS, LIMIT_NOTES

        return Capabilities(ops=frozenset(CONVERTERS), dtypes=DTYPES, symbolic_shapes=True,
                            notes=dict(LIMIT_NOTES))

    def supports(self, node: Node) -> bool:
        from .op_table import limit

        return super().supports(node) and limit(node) is None

    def lower(self, graph: Graph, weights: Mapping[str, WeightLocation],
              options: Mapping[str, Any]) -> dict[str, bytes]:
        from .lower import OPSET, lower_graph
        from .probe import installed_kernels

        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            raise DayzeroError(f"unknown onnxruntime backend option(s) {unknown}",
                               "backend options", f"known options: {list(OPTION_KEYS)}")
        config = SessionConfig.from_options(options.get("session"))
        kernels = installed_kernels().without(options.get("exclude_kernels", ()))
        lowered = lower_graph(graph, weights, kernels)
        record = {"opset": OPSET, "session": config.to_dict(), "variants": lowered.variants(),
                  "wide_io": lowered.wide_io, "nodes": lowered.nodes}
        return {MODEL: lowered.model.SerializeToString(),
                RECORD: json.dumps(record, indent=1).encode()}

    def describe(self, artifact: ArtifactView) -> str:
        """Which ONNX ops each IR node became, and the session options."""
        return format_node_map(read_record(artifact))

    def load(self, artifact: ArtifactView) -> OrtExecutable:
        from .executable import OrtExecutable
        from .session import create_session

        record = read_record(artifact)
        config = SessionConfig.from_options(record.get("session"))
        _check_kernels(record, artifact)
        model = artifact.payload_path(MODEL).read_bytes()
        try:
            session = create_session(model, config, artifact.root)
        except Exception as exc:  # ORT raises its own exception types, one per status code
            raise DayzeroError(f"onnxruntime {_ort_version()} cannot load this model: {exc}",
                               str(artifact.payload_path(MODEL)),
                               "use onnxruntime >= 1.18, or recompile the artifact with the "
                               "onnxruntime installed here") from exc
        return OrtExecutable(session, record)

    def observe(self, artifact: ArtifactView, values):
        """Intermediate values for `dayzero align` (see `observe.py`)."""
        from .observe import observer

        return observer(artifact, values, MODEL)


def _check_kernels(record: Mapping[str, Any], artifact: ArtifactView) -> None:
    """Refuse, with the fix, an artifact using contrib kernels this ORT build lacks."""
    from .probe import installed_kernels

    used = {op for entry in record.get("nodes", ()) for op in entry["onnx"] if "." in op}
    kernels = installed_kernels()
    missing = sorted(op for op in used if not kernels.has_op(op))
    if missing and len(kernels):
        raise DayzeroError(f"this onnxruntime build has no {', '.join(missing)} kernel(s), which "
                           "the artifact uses", str(artifact.root),
                           "recompile with the backend option "
                           f'{{"exclude_kernels": {json.dumps(missing)}}} for this build')


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__
