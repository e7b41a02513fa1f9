"""What each IR node became in ONNX: read back from an artifact for `dayzero inspect`.

The lowering records, per IR node in execution order, its text, the ONNX ops emitted for it
(contrib ops qualified by domain, e.g. `com.microsoft.MultiHeadAttention`) and the lowering used
(`standard` or a fused variant). The record is backend/lowering.json in the artifact, hashed in
its manifest like every other file, and checked against its schema when read. Reading it needs
neither onnx nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .record_schema import load_record

RECORD = "lowering.json"


def read_record(artifact) -> dict[str, Any]:
    """The lowering record of an onnxruntime artifact (an `ArtifactView`), checked against its
    schema (`record_schema`): an ArtifactError names the file and key of what is wrong."""
    path = Path(artifact.payload_path(RECORD))
    return load_record(path, record_name(artifact, path))


def record_name(artifact, path: Path) -> str:
    """The record's path inside the artifact (backend/lowering.json, or a segment's), the name
    errors and warnings give it."""
    try:
        return path.relative_to(artifact.root).as_posix()
    except ValueError:
        return str(path)


def node_map(artifact) -> list[dict[str, Any]]:
    """Per IR node: {"node": IR text, "onnx": [ONNX op types], "lowering": variant name}."""
    return list(read_record(artifact)["nodes"])


def format_node_map(record: Mapping[str, Any]) -> str:
    """Human-readable table: each IR node, then the ONNX ops it became (runs collapsed)."""
    lines = [f"onnx opset {record['opset']}, session options: "
             + ", ".join(f"{k}={v}" for k, v in record["session"].items())]
    if record.get("variants"):
        lines.append("fused kernels: " + ", ".join(f"{k} x{v}"
                                                   for k, v in record["variants"].items()))
    portable = record.get("portable")
    if portable:
        variants = ", ".join(f"{k} x{v}" for k, v in portable.get("variants", {}).items())
        lines.append(f"portable model backend/{portable['model']}, run where "
                     f"{', '.join(portable['replaces'])} is not available: fused kernels "
                     f"{variants or '(none)'}")
    for entry in record["nodes"]:
        lines.append(entry["node"])
        tag = "" if entry["lowering"] == "standard" else f"  [{entry['lowering']}]"
        lines.append(f"    -> {_collapse(entry['onnx']) or '(initializer)'}{tag}")
    return "\n".join(lines)


def _collapse(ops: list[str]) -> str:
    parts: list[str] = []
    for op in ops:
        if parts and parts[-1].split(" x")[0] == op:
            head, _, count = parts[-1].partition(" x")
            parts[-1] = f"{head} x{int(count or 1) + 1}"
        else:
            parts.append(op)
    return ", ".join(parts)
