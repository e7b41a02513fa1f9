"""Where model.onnx says each weight is, checked against the safetensors headers at load.

An initializer stored as external data names a file, a byte offset and a length; ONNX Runtime
reads those bytes and trusts them. The artifact reader checks the safetensors headers and every
file's hash, but a weights file re-saved with another header (other whitespace, say) and a
manifest whose hash was fixed up would shift every weight by a few bytes: wrong outputs, no
error. So the load compares each external initializer's (file, offset, length) with the header's
entry for that tensor and refuses an artifact where they differ.

On the load path, which needs neither onnx nor torch: the few ModelProto fields involved are read
straight from the protobuf wire format.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from compiler.errors import ArtifactError

# Field numbers in onnx.proto: ModelProto.graph, GraphProto.initializer, and of TensorProto
# name, external_data (StringStringEntryProto: key 1, value 2) and data_location (1: EXTERNAL).
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_NAME, _TENSOR_EXTERNAL, _TENSOR_LOCATION = 8, 13, 14
_EXTERNAL = 1


def external_initializers(model: bytes) -> dict[str, dict[str, str]]:
    """{initializer name: {"location": ..., "offset": ..., "length": ...}} of a serialized
    ModelProto, for the initializers stored as external data."""
    found: dict[str, dict[str, str]] = {}
    for number, graph in _fields(memoryview(model)):
        if number != _MODEL_GRAPH:
            continue
        for number, tensor in _fields(_bytes(graph)):
            if number != _GRAPH_INITIALIZER:
                continue
            name, info, where = "", {}, 0
            for field, value in _fields(_bytes(tensor)):
                if field == _TENSOR_NAME:
                    name = _text(value)
                elif field == _TENSOR_EXTERNAL:
                    entry = {k: _text(v) for k, v in _fields(_bytes(value))}
                    info[entry.get(1, "")] = entry.get(2, "")
                elif field == _TENSOR_LOCATION:
                    where = value
            if where == _EXTERNAL:
                found[name] = info
    return found


def check_external_data(model: bytes, model_path: str, locations: Mapping[str, Any]) -> None:
    """Refuse `model` (read from `model_path`) if an external initializer's file, offset or
    length differs from the artifact's weight `locations` (`Artifact.weight_locations()`)."""
    fix = "the weights file or model.onnx was changed after compiling; recompile the artifact"
    try:
        external = external_initializers(model)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{model_path} is not a valid ONNX model ({exc})", model_path,
                            fix) from None
    model_file = Path(model_path).name
    for name, info in external.items():
        file = info.get("location", "")
        where = f"weight '{name}' in {file or '(no file)'}, referenced by {model_path}"
        loc = locations.get(name)
        if loc is None:
            raise ArtifactError(f"{model_file} reads weight '{name}' from {file}, which holds no "
                                "tensor of that name", where, fix)
        claimed = (file, info.get("offset", "0"), info.get("length"))
        if claimed != (loc.file, str(loc.offset), str(loc.nbytes)):
            raise ArtifactError(
                f"{model_file} reads weight '{name}' at bytes {claimed[1]}..+{claimed[2]} of "
                f"{file}, but that file's safetensors header puts it at bytes "
                f"{loc.offset}..+{loc.nbytes} of {loc.file}", where, fix)


def _fields(data: memoryview) -> Iterator[tuple[int, Any]]:
    """(field number, value) of one protobuf message: an int for varints, a memoryview for
    length-delimited fields; fixed-width fields are skipped."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > end:
                raise ValueError("truncated protobuf field")
            yield number, data[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _bytes(value: Any) -> memoryview:
    if not isinstance(value, memoryview):
        raise ValueError("a message field is not length-delimited")
    return value


def _text(value: Any) -> str:
    return bytes(_bytes(value)).decode()


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated protobuf varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
