"""The ONNX model's inputs and outputs against the artifact's specs, when a session is created.

The runtime checks what the user passes against manifest.json's specs; this checks that the
model ONNX Runtime will run agrees with those specs (counts, and in order element types, ranks
and static sizes; bf16 values the model carries as float32 are recorded as `wide_io`), so an
edited manifest or a payload from another compile is refused at load instead of answering with
the wrong tensors. It reads only what the session reports: no graph parse, no onnx import (a
.dzir of tens of thousands of nodes takes seconds to parse).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.errors import ArtifactError
from compiler.ir.dtypes import DType

# numpy dtype name -> ONNX Runtime's type string
_ORT_TYPES = {"float32": "float", "float64": "double", "float16": "float16", "int64": "int64",
              "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8",
              "bool": "bool"}


def ort_type(dtype: str) -> str:
    """'tensor(float)' for 'f32', as session.get_inputs() reports it."""
    if dtype == "bf16":
        return "tensor(bfloat16)"
    return f"tensor({_ORT_TYPES[np.dtype(DType(dtype).to_numpy()).name]})"


def check_io(session: Any, manifest: Mapping[str, Any], record: Mapping[str, Any],
             model: str) -> None:
    """ArtifactError naming the first input or output where the model and the specs differ."""
    wide = record.get("wide_io", {})
    for key, args, widened in (("inputs", session.get_inputs(), wide.get("inputs", {})),
                               ("outputs", session.get_outputs(), wide.get("outputs", {}))):
        _check_side(key, manifest.get(key, []), args, widened, model)


def _check_side(key: str, specs: Sequence[Mapping[str, Any]], args: Sequence[Any],
                widened: Mapping[str, Any], model: str) -> None:
    if len(args) != len(specs):  # names may differ (a widened bf16 output is renamed)
        raise ArtifactError(f"{model} has {len(args)} {key} ({', '.join(a.name for a in args)}), "
                            f"but manifest.json lists {len(specs)}", f"manifest.json: {key}",
                            "the manifest and the model come from different compiles: "
                            "recompile the artifact")
    for spec, arg in zip(specs, args):
        where = f"manifest.json: {key} '{spec['name']}'"
        want = "tensor(float)" if arg.name in widened else ort_type(str(spec["dtype"]))
        if arg.type != want:
            raise ArtifactError(f"{model} takes {key[:-1]} '{arg.name}' as {arg.type}, but its "
                                f"spec is {spec['dtype']} ({want})", where,
                                "recompile the artifact")
        shape = list(spec["shape"])
        given = list(arg.shape) if arg.shape is not None else None
        if given is not None and (len(given) != len(shape) or any(
                isinstance(g, int) and isinstance(s, int) and g != s
                for g, s in zip(given, shape))):
            raise ArtifactError(f"{model} gives {key[:-1]} '{arg.name}' the shape {given}, but "
                                f"its spec is {shape}", where, "recompile the artifact")
