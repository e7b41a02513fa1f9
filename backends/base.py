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
    """What a backend runs, as data: op names, dtypes, and whether symbolic dims are allowed.

    `symbolic_shapes=False` means the backend's payload is built for one set of sizes: the
    default `Backend.supports` then refuses a node with a symbolic dim, and the compile driver
    refuses a graph with size symbols for it before lowering (naming the symbols).
    """

    ops: frozenset[str]
    dtypes: frozenset[str] = frozenset({"f32", "f16", "bf16", "f64", "i64", "i32", "bool"})
    symbolic_shapes: bool = True
    notes: Mapping[str, str] = field(default_factory=dict)  # op -> why it is limited


def _all_static(tensor_type) -> bool:
    """Whether every dim of an IR tensor type is a number (no size symbol)."""
    from compiler.ir.symbolic import is_static as static_dim

    return all(static_dim(d) for d in tensor_type.shape)


class Executable(Protocol):
    """A loaded model: takes inputs in graph order, returns outputs in graph order."""

    def __call__(self, inputs: Sequence[Any]) -> list[Any]: ...


class Observer(Protocol):
    """A loaded model that also returns intermediate values: (outputs, {IR value name: array})."""

    def __call__(self, inputs: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]: ...


class ArtifactView(Protocol):
    """What a backend's `load` sees of an artifact (implemented by `runtime.artifact.Artifact`,
    and for one compute segment of a partitioned model by `runtime.rank_exec.SegmentView`).

    `root` is the artifact folder, `manifest` its manifest.json as read and checked. The
    runtime's views also offer `weight_locations()` (weight name -> WeightLocation, as `lower`
    got them); a view a backend makes for its fallback (triton's) may not, so a backend reads
    it with `getattr(artifact, "weight_locations", None)`.
    """

    root: Path
    manifest: Mapping[str, Any]

    def graph_text(self) -> str: ...
    def weights(self, framework: str = "np") -> Mapping[str, Any]: ...
    def payload_path(self, relpath: str) -> Path: ...


class Backend(ABC):
    """Everything a backend provides, and everything of dayzero it may rely on.

    Must provide: `name` (the registered name, recorded in the manifest), `capabilities()`,
    `lower()` and `load()`. May override: `supports()` (when support depends on attributes),
    `default_pipeline`, `describe()` (for `dayzero inspect`), `observe()` (for `dayzero align`),
    and a keyword-only `session` parameter on `load` (run-time session settings that
    `runtime.load(path, session=...)` passes through; without it such overrides are refused).

    May use: `backends.base` (this interface), `backends.registry` (`get(name)`: another
    backend by name, e.g. for a `fallback` option) and `backends.capability_partition`
    (capability tagging of a graph into segments), plus the IR (`compiler.ir`) and
    `compiler.errors`; never another backend's modules, the passes or the runtime
    (tests/test_layering.py checks).
    `lower` gets the backend's options from the config's `backend_options:`; with a
    `--fallback` compile they also hold `fallback` (the fallback backend's name) and, when set,
    `fallback_options`.
    """

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
        """Whether this backend runs one node; the default reads `capabilities()` (op, dtypes,
        and static dims when the backend has no symbolic shapes). An override should agree
        with `capabilities()`: coverage reports read that without calling this."""
        caps = self.capabilities()
        if node.op not in caps.ops:
            return False
        values = [v for v in [*node.inputs, *node.outputs] if v is not None]
        if not all(v.type.dtype.value in caps.dtypes for v in values):
            return False
        return caps.symbolic_shapes or all(_all_static(v.type) for v in values)

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
