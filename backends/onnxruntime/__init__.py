"""The onnxruntime backend: IR -> ONNX (external weights) -> ONNX Runtime on CPU.

The fallback backend that must run every model the frontend accepts, on any machine. Lowering
(`lower`, `op_table`, `fused`) needs the `onnx` package; loading and running (`load`, `session`,
`executable`) need only numpy and onnxruntime, so an artifact runs where torch is not installed.
This module imports neither onnx nor onnxruntime until a method needs them.

Payload (under the artifact's backend/ folder):
  model.onnx      the graph; initializers are external data inside weights/*.safetensors,
                  checked at load against the safetensors headers (`external_data`)
  lowering.json   opset, session options, fused kernels used, and per IR node the ONNX ops
                  it became (read by `inspection` for `dayzero inspect`)
  model.portable.onnx   only when model.onnx uses dayzero's native kernels (`native_ops`): the
                  same graph lowered as if they were excluded, over the same external weights;
                  lowering.json's "portable" entry says which kernels it replaces and what
                  each IR node became in it. `load` runs it, with one warning naming the
                  kernels, where their library is not built or does not load, so an artifact
                  runs wherever dayzero's runtime is installed (the runtime never re-lowers).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.base import ArtifactView, Backend, Capabilities, DerivedWeight, WeightLocation
from compiler.errors import DayzeroError

from .external_data import check_external_data
from .inspection import RECORD, format_node_map, node_map, read_record, record_name
from .native_ops import DOMAIN as NATIVE_DOMAIN
from .native_ops import LIBRARY, PortableFallbackWarning
from .session import LoadAverage, SessionConfig, clamped_threads, one_minute_load

if TYPE_CHECKING:
    from compiler.ir import Graph, Node

    from .executable import OrtExecutable

MODEL = "model.onnx"
PORTABLE_MODEL = "model.portable.onnx"
OPTION_KEYS = ("session", "exclude_kernels")
OPTION_PATH = "backend_options.onnxruntime"  # the config key the options come from
DTYPES = frozenset({"f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool"})

__all__ = ["OnnxRuntimeBackend", "format_node_map", "node_map", "read_record"]


class OnnxRuntimeBackend(Backend):
    """Options (the `options` mapping given to `lower`, stored in the manifest; the user sets
    them as `backend_options: {onnxruntime: {...}}` in the config, `backend_options=` of
    `compiler.compile` or `dayzero compile --backend-option KEY=VALUE`):

    - `session`: overrides of `SessionConfig` fields (threads, optimization level, arena,
      spinning, ...), recorded in lowering.json; `load(artifact, session=...)` overrides them
      again for one run on the machine that runs the model.
    - `exclude_kernels`: ORT kernels to treat as missing, e.g. ["com.microsoft.Gelu"], to
      produce a model for a reduced ORT build that lacks them.
    """

    name = "onnxruntime"
    # Cleanup, then the causal masks proved and dropped, then fusion: its ops are what the
    # contrib kernels run (GroupQueryAttention, SkipSimplifiedLayerNormalization, ...); then the
    # masks of the attention fusion made from eager matmul/softmax chains (Gemma 2's) proved
    # too. No plan_memory: ONNX Runtime plans its own arena.
    default_pipeline = ("remove_noops,fold_constants,eliminate_common_subexpressions,"
                        "recognize_causal_masks,eliminate_dead_code,fuse,"
                        "recognize_causal_masks,eliminate_dead_code")

    def capabilities(self) -> Capabilities:
        from .op_table import CONVERTERS, LIMIT_NOTES

        return Capabilities(ops=frozenset(CONVERTERS), dtypes=DTYPES, symbolic_shapes=True,
                            notes=dict(LIMIT_NOTES))

    def supports(self, node: Node) -> bool:
        from .op_table import limit

        return super().supports(node) and limit(node) is None

    def lower(self, graph: Graph, weights: Mapping[str, WeightLocation],
              options: Mapping[str, Any]) -> dict[str, bytes]:
        from .fused import ContribFallbackWarning
        from .lower import OPSET, lower_graph
        from .probe import installed_kernels

        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            paths = ", ".join(f"'{OPTION_PATH}.{key}'" for key in unknown)
            raise DayzeroError(f"unknown onnxruntime backend option {paths}",
                               f"{OPTION_PATH}.{unknown[0]}",
                               f"known options: {list(OPTION_KEYS)}")
        config = SessionConfig.from_options(options.get("session"))
        kernels = installed_kernels()
        kernels = kernels.without(_excluded_kernels(options.get("exclude_kernels"), kernels))
        lowered = lower_graph(graph, weights, kernels)
        record = {"opset": OPSET, "session": config.to_dict(), "variants": lowered.variants(),
                  "wide_io": lowered.wide_io, "nodes": lowered.nodes}
        payload = {MODEL: lowered.model.SerializeToString()}
        native = sorted({op for entry in lowered.nodes for op in entry["onnx"]
                         if op.startswith(NATIVE_DOMAIN + ".")})
        if native:  # the plain-ORT lowering a machine without dayzero's library runs instead
            with warnings.catch_warnings():  # the choice is deliberate: no fallback warning
                warnings.simplefilter("ignore", ContribFallbackWarning)
                portable = lower_graph(graph, weights, kernels.without(native))
            payload[PORTABLE_MODEL] = portable.model.SerializeToString()
            record["portable"] = {"model": PORTABLE_MODEL, "replaces": native,
                                  "variants": portable.variants(), "nodes": portable.nodes}
        payload[RECORD] = json.dumps(record, indent=1).encode()
        return payload

    def derived_weights(self, graph: Graph, options: Mapping[str, Any]
                        ) -> Mapping[str, DerivedWeight]:
        """The weights stored in the layout dayzero's native kernels read (lower.derived_weights),
        for the kernels `lower` will choose with these options."""
        from .lower import derived_weights
        from .probe import installed_kernels

        kernels = installed_kernels()
        excluded = _excluded_kernels(dict(options or {}).get("exclude_kernels"), kernels)
        return derived_weights(graph, kernels.without(excluded))

    def describe(self, artifact: ArtifactView) -> str:
        """Which ONNX ops each IR node became, and the session options."""
        return format_node_map(read_record(artifact))

    def load(self, artifact: ArtifactView, *, session: Mapping[str, Any] | None = None,
             load_average: LoadAverage = one_minute_load) -> OrtExecutable:
        """The recorded session settings, overridden by `session` for this run (threads,
        spinning: they belong to the machine that runs the model); `auto` spinning is decided
        now, from `load_average` (injectable for tests)."""
        from .executable import OrtExecutable
        from .io_check import check_io
        from .session import create_session

        record = read_record(artifact)  # checked against its schema
        recorded = f"{record_name(artifact, Path(artifact.payload_path(RECORD)))}: session"
        config = SessionConfig.from_options(clamped_threads(record["session"], recorded),
                                            recorded)
        settings = config.overridden(session, "session").resolve(load_average)
        model_file, record = select_model(record)
        _check_kernels(record, artifact)
        model_path = artifact.payload_path(model_file)
        model = model_path.read_bytes()
        _check_weights(model, model_path, artifact)
        try:
            ort_session = create_session(model, settings, artifact.root)
        except Exception as exc:  # ORT raises its own exception types, one per status code
            raise DayzeroError(f"onnxruntime {_ort_version()} cannot load this model: {exc}",
                               str(model_path),
                               "use onnxruntime >= 1.18, or recompile the artifact with the "
                               "onnxruntime installed here") from exc
        if _is_whole_model(artifact, model_file, model_path):  # a segment has its own inputs
            check_io(ort_session, artifact.manifest, record, str(model_path))
        return OrtExecutable(ort_session, record, settings)

    def observe(self, artifact: ArtifactView, values, *,
                session: Mapping[str, Any] | None = None):
        """Intermediate values for `dayzero align` (see `observe.py`), with the recorded
        session settings overridden by `session` as in `load`."""
        from .observe import observer

        model_file, _ = select_model(read_record(artifact))
        model_path = artifact.payload_path(model_file)
        _check_weights(model_path.read_bytes(), model_path, artifact)
        return observer(artifact, values, model_file, session)


def _is_whole_model(artifact: ArtifactView, model_file: str, model_path: Path) -> bool:
    """Whether this payload is the artifact's own model, whose inputs and outputs the manifest
    describes (not a partition's segment or a fallback segment, each with its own)."""
    own = Path(artifact.root) / "backend" / model_file
    return own.resolve() == Path(model_path).resolve()


def select_model(record: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The payload model to run here and its record: model.onnx, or model.portable.onnx (with
    one warning naming the kernels) where dayzero's native kernels that model.onnx uses are
    not available. The record's nodes and variants become the portable model's."""
    from .native_ops import kernels as native_kernels
    from .probe import KernelSet, installed_kernels

    portable = record.get("portable")
    if not isinstance(portable, Mapping):
        return MODEL, dict(record)
    kernels = installed_kernels()
    if not len(kernels):  # a build that cannot list its kernels: ask the native library alone
        kernels = KernelSet(native_kernels())
    missing = [op for op in portable.get("replaces", ()) if not kernels.has_op(op)]
    if not missing:
        return MODEL, dict(record)
    warnings.warn(f"dayzero's native kernel(s) {', '.join(missing)} are not available here "
                  f"({LIBRARY} is not built or does not load into this onnxruntime); running "
                  f"the artifact's portable model backend/{portable['model']}, which uses "
                  "ONNX Runtime's own kernels instead (slower, same results) and copies the "
                  "weights those kernels store in their own layout into ONNX Runtime's at "
                  "load (more memory and load time)",
                  PortableFallbackWarning, stacklevel=3)
    chosen = {**record, "variants": portable.get("variants", {}), "nodes": portable["nodes"]}
    return str(portable["model"]), chosen


def _excluded_kernels(names: Any, kernels) -> list[str]:
    """`exclude_kernels`, checked: a list of kernel names that this onnxruntime has or that a
    fused lowering can ask for (a misspelt name would otherwise exclude nothing, silently)."""
    from .fused import VARIANTS

    where = f"{OPTION_PATH}.exclude_kernels"
    if names is None:
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise DayzeroError(f"onnxruntime option '{where}' must be a list of kernel names, "
                           f"not {names!r}", where, "e.g. [com.microsoft.Gelu]")
    fused = {str(k) for variants in VARIANTS.values() for v in variants for k in v.requires}
    unknown = [n for n in names if n not in fused and not kernels.has_op(n)]
    if unknown:
        raise DayzeroError(f"onnxruntime option '{where}' names {', '.join(unknown)}, which is "
                           f"no kernel of onnxruntime {_ort_version()}", where,
                           "name kernels as domain.Op, e.g. one of the fused kernels "
                           f"{sorted(fused)}")
    return names


def _check_kernels(record: Mapping[str, Any], artifact: ArtifactView) -> None:
    """Refuse, with the fix, an artifact using contrib kernels this ORT build lacks."""
    from .probe import installed_kernels

    used = {op for entry in record.get("nodes", ()) for op in entry["onnx"] if "." in op}
    kernels = installed_kernels()
    missing = sorted(op for op in used if not kernels.has_op(op))
    if not missing or not len(kernels):
        return
    native = [op for op in missing if op.startswith(NATIVE_DOMAIN + ".")]
    hint = ("recompile with the backend option "
            f'{{"exclude_kernels": {json.dumps(missing)}}} for this build')
    if native:
        raise DayzeroError(f"the artifact uses dayzero's native kernel(s) {', '.join(native)}, "
                           "whose library is not built in this installation", str(artifact.root),
                           "reinstall dayzero where a C++17 compiler is available "
                           f"(pip install -e . builds {LIBRARY}), or {hint}")
    raise DayzeroError(f"this onnxruntime build has no {', '.join(missing)} kernel(s), which "
                       "the artifact uses", str(artifact.root), hint)


def _check_weights(model: bytes, model_path, artifact: ArtifactView) -> None:
    """Every external initializer of `model` where the safetensors headers put that weight."""
    locations = getattr(artifact, "weight_locations", None)
    if locations is not None:
        check_external_data(model, str(model_path), locations())


def _ort_version() -> str:
    from .ort_module import ort

    return ort.__version__
