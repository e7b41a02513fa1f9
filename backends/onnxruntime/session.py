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
  Thread counts recorded in an artifact are clamped to that same count when loaded (with a
  warning naming the file and key: 5000 threads took a load past 300 s, 100000 crashed ORT),
  and an explicit override above it is refused (`clamped_threads`, `overridden`).
- one inter-op thread, sequential execution: the graphs are chains of large ops; running
  independent branches in parallel adds scheduling cost and steals cores from the intra-op pool.
- memory arena and memory pattern on: activations are reused across calls instead of being
  allocated per op; the pattern is re-planned whenever the input shapes change.
- spinning `auto`: ORT's intra-op workers busy-wait between ops when spinning is allowed. The
  default `auto` decides when the session is created, on the machine that runs the model: spin
  only when the machine is not oversubscribed, i.e. the one-minute load average is below the
  number of CPUs in the process's affinity mask. Measured on the 2-core development machine with
  the benchmark decoder (seq 128): idle, 7.2 ms median per call with spinning against 10.6 ms
  without (without spinning ORT's sleeping worker wakes too late and the calling thread does
  nearly all the work: CPU time per call equals wall time); under load (load average ~7),
  66 ms with spinning against 26 ms without, because busy-waiting workers steal the cores the
  computation needs. `true`/`false` force it either way; backend/lowering.json keeps the
  configured value ("auto"), the executable reports the resolved one.

This module is on the load path: it imports onnxruntime, never onnx or torch.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from compiler.errors import DayzeroError, InputError
from compiler.heap import trim_heap

OPT_LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_MODES = ("sequential", "parallel")
SPINNING = (True, False, "auto")
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
SPINNING_KEY = "session.intra_op.allow_spinning"
OPTION_PATH = "backend_options.onnxruntime.session"  # where the options come from at compile time
MAX_THREADS = 65536  # no machine has more CPUs: a bigger count is not a setting but an error
THREAD_KEYS = ("intra_op_threads", "inter_op_threads")

LoadAverage = Callable[[], float]


def one_minute_load() -> float:
    """The machine's one-minute load average (infinite where the OS cannot tell: no spinning)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not on Unix
        return math.inf


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask), not the machine's core count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


class ThreadsClampedWarning(UserWarning):
    """An artifact records more threads than this process has CPUs; fewer are used."""


@dataclass(frozen=True)
class SessionConfig:
    graph_optimization_level: str = "all"
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    execution_mode: str = "sequential"
    cpu_mem_arena: bool = True
    mem_pattern: bool = True
    allow_spinning: bool | str = "auto"

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None,
                     where: str = OPTION_PATH) -> SessionConfig:
        """Defaults overridden by `options`, checked by name; errors name `where`.<key>."""
        if options is not None and not isinstance(options, Mapping):
            raise DayzeroError(f"onnxruntime option '{where}' must be a mapping of session "
                               f"settings, not {options!r}", where,
                               f"e.g. {{intra_op_threads: 2}}; known settings: {_known()}")
        options = dict(options or {})
        unknown = sorted(set(options) - set(_known()))
        if unknown:
            paths = ", ".join(f"'{where}.{key}'" for key in unknown)
            raise DayzeroError(f"unknown onnxruntime session option {paths}",
                               f"{where}.{unknown[0]}", f"known options: {_known()}")
        config = cls(**options)
        config.check(where)
        return config

    def overridden(self, overrides: Mapping[str, Any] | None, where: str) -> SessionConfig:
        """This config with `overrides` (checked like `from_options`) applied on top. A thread
        count above the CPUs this process may run on is refused: it was asked for explicitly,
        on this machine, and more threads than CPUs only slow the run (or crash ORT)."""
        if not overrides:
            return self
        SessionConfig.from_options(overrides, where)  # names, types and values, checked
        cpus = affinity_cpus()
        for key in THREAD_KEYS:
            if key in overrides and overrides[key] > cpus:
                raise InputError(f"session setting '{where}.{key}' asks for {overrides[key]} "
                                 f"threads, more than the {cpus} CPUs this process may run on "
                                 "(its affinity mask)", f"{where}.{key}",
                                 f"use at most {cpus}, or 0 for one thread per CPU")
        return replace(self, **dict(overrides))

    def check(self, where: str = OPTION_PATH) -> None:
        checks = [
            ("graph_optimization_level", self.graph_optimization_level in OPT_LEVELS,
             f"one of {OPT_LEVELS}"),
            ("execution_mode", self.execution_mode in EXECUTION_MODES,
             f"one of {EXECUTION_MODES}"),
            ("intra_op_threads", _count(self.intra_op_threads),
             f"an integer from 0 to {MAX_THREADS} (0: one per CPU)"),
            ("inter_op_threads", _count(self.inter_op_threads),
             f"an integer from 0 to {MAX_THREADS}"),
            ("cpu_mem_arena", isinstance(self.cpu_mem_arena, bool), "true or false"),
            ("mem_pattern", isinstance(self.mem_pattern, bool), "true or false"),
            ("allow_spinning", isinstance(self.allow_spinning, bool) or
             self.allow_spinning == "auto", 'true, false or "auto"'),
        ]
        for key, ok, want in checks:
            if not ok:
                raise DayzeroError(f"onnxruntime session option '{where}.{key}' has invalid "
                                   f"value {getattr(self, key)!r}", f"{where}.{key}",
                                   f"use {want}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def resolved_intra_threads(self) -> int:
        return self.intra_op_threads or affinity_cpus()

    def resolve(self, load_average: LoadAverage = one_minute_load) -> ResolvedSession:
        """The settings as applied on this machine now: threads counted, `auto` decided.

        `load_average` is the probe `auto` spinning consults (injectable, for tests); it is
        read once, only when spinning is `auto`.
        """
        threads = self.resolved_intra_threads()
        if self.allow_spinning != "auto":
            return ResolvedSession(self, threads, bool(self.allow_spinning))
        load, cpus = float(load_average()), affinity_cpus()
        return ResolvedSession(self, threads, load < cpus, load, cpus)


@dataclass(frozen=True)
class ResolvedSession:
    """A `SessionConfig` decided for this machine (what the executable reports)."""

    config: SessionConfig
    intra_op_threads: int
    allow_spinning: bool
    load_average: float | None = None  # the reading `auto` spinning was decided on
    cpus: int | None = None  # CPUs in the affinity mask it was compared with

    def to_dict(self) -> dict[str, Any]:
        """The settings as applied (no 0 threads, no "auto")."""
        return {**self.config.to_dict(), "intra_op_threads": self.intra_op_threads,
                "allow_spinning": self.allow_spinning}

    def describe(self) -> str:
        """One log line: every setting as applied, with how `auto` spinning was decided."""
        parts = [f"{key}={_text(value)}" for key, value in self.to_dict().items()]
        if self.load_average is not None:
            sign = "<" if self.allow_spinning else ">="
            parts[-1] += (f" (auto: load average {self.load_average:.2f} {sign} "
                          f"{self.cpus} CPUs)")
        return "onnxruntime session: " + ", ".join(parts)


def clamped_threads(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Session settings read from an artifact (at `where`) with each thread count above the
    CPUs this process may run on lowered to that number, one warning per key: the artifact was
    compiled elsewhere, and the machine that runs it decides (5000 threads took a load past
    300 s; 100000 crashed ONNX Runtime)."""
    cpus = affinity_cpus()
    lowered = {key: cpus for key in THREAD_KEYS
               if type(options.get(key)) is int and options[key] > cpus}
    for key in lowered:
        warnings.warn(f"{where}.{key} is {options[key]}, more than the {cpus} CPUs this "
                      f"process may run on; using {cpus}", ThreadsClampedWarning, stacklevel=3)
    return {**options, **lowered}


def _known() -> list[str]:
    return sorted(f.name for f in fields(SessionConfig))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_THREADS


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def session_options(config: SessionConfig | ResolvedSession,
                    external_folder: Path | None = None):
    """An `onnxruntime.SessionOptions` for `config`; external data is read from `external_folder`.

    A `SessionConfig` is resolved here with the machine's load average; pass a
    `ResolvedSession` to apply settings decided earlier (and reported by the executable).
    External-data locations in model.onnx are relative to the artifact root (for example
    `weights/model-00001-of-00001.safetensors`): ONNX Runtime refuses locations that climb out of
    the model's folder with `..`, so the model is loaded from bytes and ORT is told the root here.
    """
    from .native_ops import register
    from .ort_module import ort

    settings = config if isinstance(config, ResolvedSession) else config.resolve()
    chosen = settings.config
    levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    modes = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
             "parallel": ort.ExecutionMode.ORT_PARALLEL}
    so = ort.SessionOptions()
    so.graph_optimization_level = levels[chosen.graph_optimization_level]
    so.intra_op_num_threads = settings.intra_op_threads
    so.inter_op_num_threads = chosen.inter_op_threads
    so.execution_mode = modes[chosen.execution_mode]
    so.enable_cpu_mem_arena = chosen.cpu_mem_arena
    so.enable_mem_pattern = chosen.mem_pattern
    so.add_session_config_entry(SPINNING_KEY, "1" if settings.allow_spinning else "0")
    so.log_severity_level = 3  # errors only: ORT's warnings are about its own fusions
    if external_folder is not None:
        so.add_session_config_entry(EXTERNAL_FOLDER_KEY, str(Path(external_folder).resolve()))
    register(so)  # dayzero's own kernels (ai.dayzero), when built
    return so


def create_session(model: bytes, config: SessionConfig | ResolvedSession,
                   external_folder: Path | None = None):
    """An inference session on the CPU execution provider for serialized ONNX `model`. The heap
    is trimmed after it: the load's constant folding frees each stored weight it repacks."""
    from .ort_module import ort

    session = ort.InferenceSession(model, session_options(config, external_folder),
                                   providers=["CPUExecutionProvider"])
    trim_heap()
    return session
