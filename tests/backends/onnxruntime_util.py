"""Helpers for the onnxruntime backend tests: compile a graph into an artifact, check, load."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx

from backends.onnxruntime import OnnxRuntimeBackend
from compiler.ir import Graph
from compiler.writer import write_artifact
from runtime.artifact import Artifact


def compile_graph(graph: Graph, out: Path, options: dict | None = None) -> Path:
    return write_artifact(out, graph, OnnxRuntimeBackend(), options=options or {})


def load(path: Path):
    return OnnxRuntimeBackend().load(Artifact(path))


def check_onnx(artifact: Path) -> None:
    """The path-based onnx.checker (external data included) on the artifact's model.onnx.

    External-data locations are relative to the artifact root, so the checker reads a copy of
    model.onnx placed there (a dot-file, which the artifact reader ignores), then it is removed.
    """
    copy = artifact / ".model.check.onnx"
    shutil.copyfile(artifact / "backend" / "model.onnx", copy)
    try:
        onnx.checker.check_model(str(copy), full_check=True)
    finally:
        copy.unlink()


def run_x(onnx_model, x: np.ndarray, threads: int = 2) -> np.ndarray:
    """The first output of a one-input ONNX model (its input named "x") on a session made with
    dayzero's options (the native kernels registered), not spinning."""
    import onnxruntime as ort

    from backends.onnxruntime.session import SessionConfig, session_options

    options = session_options(SessionConfig(intra_op_threads=threads, allow_spinning=False))
    session = ort.InferenceSession(onnx_model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]
