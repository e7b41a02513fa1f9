"""ONNX Runtime session options, chosen deliberately and recorded in the artifact.

Every option is set explicitly rather than left to ONNX Runtime's defaults, so that a run is
reproducible from what the artifact records (backend/lowering.json, listed with its hash in the
manifest) and the benchmark's torch.onnx.export peer can be given exactly the same options:

- graph optimization level `all`: ORT's fusions turn the standard-op forms this backend emits
  (rms_norm, gelu, matmul + bias) into its fused CPU kernels, and its layout transforms run at
  load time on the machine that runs the model, so nothing machine-specific is stored.
- intra-op threads `0` means "one per CPU this process may run on" (its affinity mask), resolved
  at load time; ORT's own default counts the machine's physical cores, which oversubscribes a
  container or a process pinned to a subset of cores.
- one inter-op thread, sequential execution: the graphs are chains of large ops; running
  independent branches in parallel adds scheduling cost and steals cores from the intra-op pool.
- memory arena and memory pattern on: activations are reused across calls instead of being
  allocated per op; the pattern is re-planned whenever the input shapes change.
- spinning off: ORT's workers would otherwise busy-wait between ops. On a dedicated machine that
  saves a thread wake-up per op, but on a shared or oversubscribed one (CI, a laptop, a container
  with a CPU quota) spinning threads steal the cores the computation needs: on the 2-core
  development machine under load, the benchmark decoder took 66 ms with spinning and 26 ms
  without (single-thread compute time 10 ms). Turn it on with `session.allow_spinning` on
  dedicated hardware.

This module is on the load path: it imports onnxruntime, never onnx or torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from compiler.errors import DayzeroError

OPT_LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_MODES = ("sequential", "parallel")
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


@dataclass(frozen=True)
class SessionConfig:
    graph_optimization_level: str = "all"
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    execution_mode: str = "sequential"
    cpu_mem_arena: bool = True
    mem_pattern: bool = True
    allow_spinning: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> SessionConfig:
        """Defaults overridden by `options` (the backend option `session`), checked by name."""
        options = dict(options or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise DayzeroError(f"unknown onnxruntime session option(s) {unknown}",
                               "backend option session", f"known options: {sorted(known)}")
        config = cls(**options)
        config.check()
        return config

    def check(self) -> None:
        checks = [
            ("graph_optimization_level", self.graph_optimization_level in OPT_LEVELS,
             f"one of {OPT_LEVELS}"),
            ("execution_mode", self.execution_mode in EXECUTION_MODES,
             f"one of {EXECUTION_MODES}"),
            ("intra_op_threads", _count(self.intra_op_threads), "an integer >= 0"),
            ("inter_op_threads", _count(self.inter_op_threads), "an integer >= 0"),
            ("cpu_mem_arena", isinstance(self.cpu_mem_arena, bool), "true or false"),
            ("mem_pattern", isinstance(self.mem_pattern, bool), "true or false"),
            ("allow_spinning", isinstance(self.allow_spinning, bool), "true or false"),
        ]
        for key, ok, want in checks:
            if not ok:
                raise DayzeroError(f"onnxruntime session option {key}={getattr(self, key)!r} "
                                   "is invalid", f"backend option session.{key}", f"use {want}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def resolved_intra_threads(self) -> int:
        if self.intra_op_threads:
            return self.intra_op_threads
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not on Linux
            return os.cpu_count() or 1


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def session_options(config: SessionConfig, external_folder: Path | None = None):
    """An `onnxruntime.SessionOptions` for `config`; external data is read from `external_folder`.

    External-data locations in model.onnx are relative to the artifact root (for example
    `weights/model-00001-of-00001.safetensors`): ONNX Runtime refuses locations that climb out of
    the model's folder with `..`, so the model is loaded from bytes and ORT is told the root here.
    """
    import onnxruntime as ort

    levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    modes = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
             "parallel": ort.ExecutionMode.ORT_PARALLEL}
    so = ort.SessionOptions()
    so.graph_optimization_level = levels[config.graph_optimization_level]
    so.intra_op_num_threads = config.resolved_intra_threads()
    so.inter_op_num_threads = config.inter_op_threads
    so.execution_mode = modes[config.execution_mode]
    so.enable_cpu_mem_arena = config.cpu_mem_arena
    so.enable_mem_pattern = config.mem_pattern
    so.add_session_config_entry("session.intra_op.allow_spinning",
                                "1" if config.allow_spinning else "0")
    so.log_severity_level = 3  # errors only: ORT's warnings are about its own fusions
    if external_folder is not None:
        so.add_session_config_entry(EXTERNAL_FOLDER_KEY, str(Path(external_folder).resolve()))
    return so


def create_session(model: bytes, config: SessionConfig, external_folder: Path | None = None):
    """An inference session on the CPU execution provider for serialized ONNX `model`."""
    import onnxruntime as ort

    return ort.InferenceSession(model, session_options(config, external_folder),
                                providers=["CPUExecutionProvider"])
