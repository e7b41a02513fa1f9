"""Intermediate values for `dayzero align`: a debug variant of model.onnx with extra outputs.

Lowering names each IR node's result after its IR value (`lower._rename`), so an intermediate
is observable by adding its name to the graph outputs. The variant is built in memory from the
artifact's model.onnx and run with the artifact's session options; the artifact is not changed.
ONNX Runtime keeps every graph output materialized, so its fusions stop at observed values: the
numerics are those of the same kernels, with fewer fusions across the observed boundaries.
Half-precision values are returned as stored; bfloat16 and float8 (which numpy cannot hold) are
cast to float32 inside the model, which is exact.

Debug path only: it needs the onnx package (the plain load path does not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compiler.ir import DType, parse_ir

from .builder import ONNX_DTYPES
from .inspection import RECORD, read_record, record_name
from .lower import WIDE_IO
from .session import SessionConfig, clamped_threads, create_session

_WIDE_ONNX = {ONNX_DTYPES[d] for d in WIDE_IO}


class OrtObserver:
    """Runs the variant: (outputs, {IR value name: array}) per call."""

    def __init__(self, executable, outputs: int, observed: list[str]):
        self.executable = executable
        self.outputs = outputs
        self.observed = observed

    def __call__(self, inputs: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
        results = self.executable(inputs)
        extra = dict(zip(self.observed, results[self.outputs:]))
        return results[:self.outputs], extra


def observer(artifact, values: Sequence[str], model_file: str,
             session: Mapping[str, Any] | None = None) -> OrtObserver:
    """An observer for `artifact` returning those of `values` that the ONNX graph computes."""
    import onnx
    from onnx import helper

    from .executable import OrtExecutable

    model = onnx.load_model_from_string(artifact.payload_path(model_file).read_bytes())
    graph = model.graph
    produced = {name for node in graph.node for name in node.output if name}
    outputs = {o.name for o in graph.output}
    types = _onnx_types(model, artifact)
    observed = []
    for name in dict.fromkeys(values):
        if name not in produced or name in outputs or name not in types:
            continue
        source = name
        if types[name] in _WIDE_ONNX:  # numpy cannot hold it: widen to float32 (exact)
            source = f"{name}__observed_f32"
            graph.node.append(helper.make_node("Cast", [name], [source],
                                               to=ONNX_DTYPES[DType.f32],
                                               name=f"{name}__observe_cast"))
        elem = ONNX_DTYPES[DType.f32] if source != name else types[name]
        graph.output.append(helper.make_tensor_value_info(source, elem, None))
        observed.append(name)
    record = read_record(artifact)
    where = f"{record_name(artifact, Path(artifact.payload_path(RECORD)))}: session"
    config = SessionConfig.from_options(clamped_threads(record["session"], where),
                                        where)
    settings = config.overridden(session, "session").resolve()
    ort_session = create_session(model.SerializeToString(), settings, artifact.root)
    return OrtObserver(OrtExecutable(ort_session, record, settings), len(outputs), observed)


def _onnx_types(model, artifact) -> dict[str, int]:
    """ONNX element type of each IR-named value: the IR's dtype (a node's renamed result
    is the value in its IR dtype, after any cast back from float32)."""
    graph = parse_ir(artifact.graph_text())
    return {v.name: ONNX_DTYPES[v.type.dtype] for n in graph.nodes for v in n.outputs
            if v.type.dtype in ONNX_DTYPES}
