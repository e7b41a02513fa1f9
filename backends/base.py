"""The Backend interface: what a backend supports, how it lowers a graph, how it loads a payload.

A backend is a class registered by name (see `backends.registry`). The driver asks it which nodes
it supports, calls `lower` once the weights are laid out in the artifact, and stores the returned
payload files under `backend/`; the runtime calls `load` on the finished artifact. Capabilities are
data (`Capabilities`), so coverage reports and partitioners read them without running anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from compiler.ir import Graph, Node


@dataclass(frozen=True)
class WeightLocation:
    """Where a weight's bytes sit inside the artifact (file relative to the artifact root)."""

    file: str
    offset: int  # absolute byte offset of the tensor data in `file`
    nbytes: int
    dtype: str  # IR dtype name
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Capabilities:
    """What a backend runs, as data: op names, dtypes, and whether symbolic dims are allowed."""

    ops: frozenset[str]
    dtypes: frozenset[str] = frozenset({"f32", "f16", "bf16", "f64", "i64", "i32", "bool"})
    symbolic_shapes: bool = True
    notes: Mapping[str, str] = field(default_factory=dict)  # op -> why it is limited


class Executable(Protocol):
    """A loaded model: takes inputs in graph order, returns outputs in graph order."""

    def __call__(self, inputs: Sequence[Any]) -> list[Any]: ...


class Observer(Protocol):
    """A loaded model that also returns intermediate values: (outputs, {IR value name: array})."""

    def __call__(self, inputs: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]: ...


class ArtifactView(Protocol):
    """What a backend's `load` sees of an artifact (implemented by `runtime.artifact.Artifact`)."""

    root: Path
    manifest: Mapping[str, Any]

    def graph_text(self) -> str: ...
    def weights(self, framework: str = "np") -> Mapping[str, Any]: ...
    def payload_path(self, relpath: str) -> Path: ...


class Backend(ABC):
    name: str = ""
    # The pass pipeline this backend's lowering is best with, used when neither the caller nor
    # the config names one (None: the global default, passes.DEFAULT_PIPELINE). A string, so a
    # backend declares it without importing the passes. Partitioned compiles always use the
    # global default: tensor parallelism shards the unfused, unmerged projections.
    default_pipeline: str | None = None

    @abstractmethod
    def capabilities(self) -> Capabilities:
        """Ops, dtypes and shape kinds this backend runs."""

    def supports(self, node: Node) -> bool:
        """Whether this backend runs one node; the default reads `capabilities()`."""
        caps = self.capabilities()
        if node.op not in caps.ops:
            return False
        return all(v.type.dtype.value in caps.dtypes for v in [*node.inputs, *node.outputs]
                   if v is not None)

    @abstractmethod
    def lower(self, graph: Graph, weights: Mapping[str, WeightLocation],
              options: Mapping[str, Any]) -> dict[str, bytes]:
        """Payload files (path under backend/ -> bytes) for a graph whose weights are laid out."""

    @abstractmethod
    def load(self, artifact: ArtifactView) -> Executable:
        """An executable for a finished artifact; must not execute code stored in it."""

    def describe(self, artifact: ArtifactView) -> str | None:
        """What this backend made of the graph, for `dayzero inspect` (None: nothing to add)."""
        return None

    def observe(self, artifact: ArtifactView, values: Sequence[str]) -> Observer | None:
        """Optional, for `dayzero align`: like `load`, but each call also returns the
        intermediate `values` (IR value names of the artifact's graph) as computed, so they
        can be compared layer by layer with the reference. Values the backend does not
        materialize under their IR name may be left out. None (the default): this backend
        cannot expose intermediates, and align compares the outputs only."""
        return None
