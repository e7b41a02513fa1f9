"""The Backend interface: what a backend supports, how it lowers a graph, how it loads a payload.

A backend is a class registered by name (see `backends.registry`). The driver asks it which nodes
it supports, calls `lower` once the weights are laid out in the artifact, and stores the returned
payload files under `backend/`; the runtime calls `load` on the finished artifact. Capabilities are
data (`Capabilities`), so coverage reports and partitioners read them without running anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from compiler.errors import ArtifactError

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
    # (source weight, layout name) when the writer computed this tensor from a graph weight
    # (`Backend.derived_weights`); None for a graph weight stored as it is. Known at compile
    # time only (the runtime reads it from the manifest's `derived_weights`).
    derived: tuple[str, str] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class WeightLayout:
    """A reordering of one weight into the layout a kernel reads, as pure NumPy functions.

    The writer applies `forward` to one tensor at a time as it writes it (compile time), so a
    load maps the stored bytes straight into the kernel; `inverse` gives the graph's own layout
    back to a reader that needs it (`dayzero align`'s reference run). `shape` is the stored
    tensor's shape for a source of the given shape, or None when the source does not fit.

    `params` names the integers a layout needs beyond its source's shape (a 1-D scales tensor
    does not say how many output columns it holds): the three functions take them as keyword
    arguments, and each derived weight records their values (`DerivedWeight.params`, the
    manifest's `derived_weights`)."""

    forward: Callable[..., np.ndarray]
    inverse: Callable[..., np.ndarray]
    shape: Callable[..., tuple[int, ...] | None]
    params: tuple[str, ...] = ()

    def arguments(self, params: Any) -> dict[str, int] | None:
        """`params` as this layout's keyword arguments: None unless it maps exactly the
        declared names to positive ints (a manifest's values are not trusted)."""
        if not isinstance(params, Mapping) or set(params) != set(self.params):
            return None
        if not all(type(v) is int and 0 < v < 2**62 for v in params.values()):
            return None
        return dict(params)


PANEL = 32  # output columns per panel of ai.dayzero.PackedLinear (native/packed_linear.h)
INT4_TILE = 8  # output columns per tile of ai.dayzero.MatMulInt4 (native/int4_matmul.h)


def _panels(weight: np.ndarray) -> np.ndarray:
    n, k = weight.shape
    return np.ascontiguousarray(weight.reshape(n // PANEL, PANEL, k).transpose(0, 2, 1))


def _unpanel(panels: np.ndarray) -> np.ndarray:
    tiles, k, width = panels.shape
    return np.ascontiguousarray(panels.transpose(0, 2, 1)).reshape(tiles * width, k)


def _panel_shape(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    if len(shape) != 2 or shape[0] % PANEL:
        return None
    return (shape[0] // PANEL, shape[1], PANEL)


def _code_tiles(codes: np.ndarray) -> np.ndarray:
    n, blocks, _ = codes.shape
    tiles = codes.reshape(n // INT4_TILE, INT4_TILE, blocks // 2, 32).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(tiles)


def _untile_codes(tiles: np.ndarray) -> np.ndarray:
    count, pairs, width, _ = tiles.shape
    return np.ascontiguousarray(tiles.transpose(0, 2, 1, 3)).reshape(count * width, pairs * 2,
                                                                     16)


def _code_tile_shape(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    if len(shape) != 3 or shape[0] % INT4_TILE or shape[1] % 2 or shape[2] != 16:
        return None
    return (shape[0] // INT4_TILE, shape[1] // 2, INT4_TILE, 32)


def _scale_tiles(scales: np.ndarray, rows: int) -> np.ndarray:
    blocks = scales.shape[0] // rows
    tiles = scales.reshape(rows // INT4_TILE, INT4_TILE, blocks).transpose(0, 2, 1)
    return np.ascontiguousarray(tiles)


def _untile_scales(tiles: np.ndarray, rows: int) -> np.ndarray:
    return np.ascontiguousarray(tiles.transpose(0, 2, 1)).reshape(-1)


def _scale_tile_shape(shape: tuple[int, ...], rows: int) -> tuple[int, ...] | None:
    if len(shape) != 1 or rows % INT4_TILE or shape[0] % rows:
        return None
    return (rows // INT4_TILE, shape[0] // rows, INT4_TILE)


# Layout name (recorded in the manifest's `derived_weights`) -> how to make and undo it. Data:
# a backend names layouts, the writer and the runtime look them up here.
WEIGHT_LAYOUTS: dict[str, WeightLayout] = {
    # [N, K] -> [N/32, K, 32]: panels of 32 output columns, each stored input-major
    "panels32": WeightLayout(_panels, _unpanel, _panel_shape),
    # MatMulNBits' int4 codes u8 [N, K/32, 16] -> [N/8, K/64, 8, 32]: per tile of 8 output
    # columns and pair of blocks, each column's 32 bytes (64 codes) side by side
    "int4_tiles8": WeightLayout(_code_tiles, _untile_codes, _code_tile_shape),
    # their scales [N * K/32] (rows = N) -> [N/8, K/32, 8]: per tile and block, 8 columns' scales
    "scale_tiles8": WeightLayout(_scale_tiles, _untile_scales, _scale_tile_shape, ("rows",)),
}


def with_sources(weights: Mapping[str, Any], derived: Mapping[str, Any] | None,
                 wrap: Callable[[np.ndarray], Any] = lambda a: a) -> dict[str, Any]:
    """`weights` (by stored name) plus every graph weight the artifact stores only in a
    kernel's layout (its manifest's `derived_weights`), read back through the layout's
    inverse and passed to `wrap` (e.g. torch.from_numpy): a copy, for readers that need the
    graph's own layout (`dayzero align`'s reference run), never on a backend's load path.
    An entry naming no known layout, or parameters it does not take, is left out (the reader
    then reports the missing weight); a stored tensor the layout cannot undo is an
    ArtifactError."""
    out = dict(weights)
    for name, entry in (derived if isinstance(derived, Mapping) else {}).items():
        entry = entry if isinstance(entry, Mapping) else {}
        source, layout = entry.get("source"), WEIGHT_LAYOUTS.get(str(entry.get("layout")))
        kwargs = layout.arguments(entry.get("params", {})) if layout is not None else None
        if kwargs is None or not isinstance(source, str) or source in out or name not in weights:
            continue
        out[source] = wrap(_undone(layout, np.asarray(weights[name]), kwargs, name))
    return out


def _undone(layout: WeightLayout, stored: np.ndarray, kwargs: dict[str, int],
            name: str) -> np.ndarray:
    try:
        return layout.inverse(stored, **kwargs)
    except (ValueError, IndexError, ZeroDivisionError) as exc:
        raise ArtifactError(f"stored weight '{name}' of shape {list(stored.shape)} is not in "
                            f"the layout its manifest entry names ({exc})",
                            f"manifest.json derived_weights.{name}",
                            "recompile the model; the artifact is corrupted") from exc


@dataclass(frozen=True)
class DerivedWeight:
    """A tensor the artifact stores computed from graph weight `source` by `WEIGHT_LAYOUTS
    [layout]` with `params` (the layout's declared parameters). `replaces`: the kernel is the
    source's only reader, so the source itself is not stored (one copy of the bytes);
    otherwise both are."""

    source: str
    layout: str
    replaces: bool = True
    params: Mapping[str, int] = field(default_factory=dict)


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

    def derived_weights(self, graph: Graph, options: Mapping[str, Any]
                        ) -> Mapping[str, DerivedWeight]:
        """{stored name: DerivedWeight}: weights to store in the layout this backend's kernels
        read, computed by the writer one tensor at a time before `lower` (which then finds
        them in its `weights`, each location's `derived` naming its source and layout).
        Default: none, every weight is stored as the graph has it."""
        return {}

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
