"""Files of an artifact, each written with its size and sha256 recorded for the manifest.

Shared by the single-model writer (`artifact_writer`) and the per-rank writer (`rank_writer`).
Weights a backend asks for in its kernels' layout (`Backend.derived_weights`) are computed
here as the file is written, a slice of whole row blocks of one source at a time
(`DerivedStream`), and stored instead of the graph's layout when the kernel is their only
reader: a load then maps them unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from backends import WeightLocation
from backends.base import INT4_TILE, PANEL, WEIGHT_LAYOUTS, DerivedWeight
from compiler.errors import DayzeroError
from compiler.ir import Graph, symbolic
from compiler.ir.weights import is_lazy
from runtime import safetensors_io as st
from runtime.artifact import WEIGHTS_DIR
from runtime.to_numpy import to_numpy


def put_file(root: Path, rel: str, data: bytes, files: dict[str, dict[str, Any]]) -> None:
    """Write `data` at `rel` under `root` and record its size and hash in `files`.

    Each file is created, never overwritten: two parts of a compile naming the same file (an
    extra file and a payload file, say) is an error, not a silent loss of one of them."""
    path = root / rel
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as f:
            f.write(data)
    except (FileExistsError, NotADirectoryError):
        raise DayzeroError(f"two files of the artifact would be written at {rel}", rel,
                           "give the extra or payload files distinct paths") from None
    files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_weights(root: Path, graph: Graph, files: dict[str, dict[str, Any]], progress,
                  shard_bytes: int, folder: str = WEIGHTS_DIR,
                  derived: Mapping[str, DerivedWeight] | None = None
                  ) -> tuple[dict[str, WeightLocation], list[str]]:
    """The graph's weights as safetensors shards in `folder`, recorded in `files`; returns
    where each weight's bytes lie (what `lower` needs) and the shard files. `derived` tensors
    are written too, and a source every one of its derived tensors replaces is not."""
    derived = dict(derived or {})
    specs = {name: _weight_spec(graph, name) for name in graph.weights}
    dropped = replaced_sources(derived)
    specs = {name: spec for name, spec in specs.items() if name not in dropped}
    specs.update({name: _derived_spec(graph, name, d) for name, d in derived.items()})
    sizes = [(name, _nbytes(*spec)) for name, spec in specs.items()]
    shards = st.plan_shards(sizes, shard_bytes)
    try:
        (root / folder).mkdir(parents=True)
    except FileExistsError:
        raise DayzeroError(f"the weights folder {folder}/ already holds other files", folder,
                           "give the extra files paths outside it") from None
    locations: dict[str, WeightLocation] = {}
    shard_files = []
    data = DerivedData(graph.weight_data, derived, specs)
    for index, names in enumerate(shards):
        rel = f"{folder}/model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        entries, digest, size = st.write_file(root / rel, {n: specs[n] for n in names}, data,
                                              progress)
        files[rel] = {"size": size, "sha256": digest}
        shard_files.append(rel)
        for e in entries:
            how = (derived[e.name].source, derived[e.name].layout) if e.name in derived else None
            locations[e.name] = WeightLocation(rel, e.begin, e.nbytes, e.dtype.value, e.shape,
                                               how)
    return locations, shard_files


def replaced_sources(derived: Mapping[str, DerivedWeight]) -> set[str]:
    """Graph weights not stored: every derived tensor made from them replaces them."""
    sources = {d.source for d in derived.values()}
    kept = {d.source for d in derived.values() if not d.replaces}
    return sources - kept


def derived_manifest(derived: Mapping[str, DerivedWeight]) -> dict[str, dict[str, Any]]:
    """The manifest's `derived_weights`: {stored name: {"source", "layout"[, "params"]}}, so
    an artifact says which stored tensors are a graph weight in a kernel's layout (which
    layout, with which parameters when it takes any)."""
    return {name: {"source": d.source, "layout": d.layout,
                   **({"params": dict(d.params)} if d.params else {})}
            for name, d in sorted(derived.items())}


class DerivedData(Mapping):
    """`weight_data` with the derived tensors added, each computed from its source only when
    the writer reads it, a block of rows at a time (`DerivedStream`)."""

    def __init__(self, data: Mapping[str, Any], derived: Mapping[str, DerivedWeight],
                 specs: Mapping[str, tuple[Any, tuple[int, ...]]]):
        self._data, self._derived, self._specs = data, derived, specs

    def __getitem__(self, name: str) -> Any:
        spec = self._derived.get(name)
        if spec is None:
            return self._data[name]
        return DerivedStream(self._data[spec.source], spec, *self._specs[name])

    def __iter__(self) -> Iterator[str]:
        yield from self._data
        yield from (n for n in self._derived if n not in self._data)

    def __len__(self) -> int:
        return len(self._data) + sum(n not in self._data for n in self._derived)


# Rows of its source that each layout reorders on its own: the stored tensor is these blocks'
# reorderings one after the other, so it is computed a slice of whole blocks at a time
_ROW_BLOCKS = {"panels32": PANEL, "int4_tiles8": INT4_TILE, "scale_tiles8": INT4_TILE}
SLICE_BYTES = 16 * 2**20


class DerivedStream:
    """A derived tensor's bytes, computed from slices of whole row blocks of its source (read
    a slice at a time from a checkpoint, or sliced from memory): never the whole reordering,
    nor a checkpoint source read whole. What `safetensors_io.tensor_chunks` streams."""

    def __init__(self, source: Any, spec: DerivedWeight, ir_dtype, shape: tuple[int, ...]):
        self.source, self.spec, self.ir_dtype, self.shape = source, spec, ir_dtype, shape

    def iter_chunks(self, chunk_bytes: int = SLICE_BYTES) -> Iterator[memoryview]:
        spec, layout = self.spec, WEIGHT_LAYOUTS[self.spec.layout]
        rows = int(spec.params["rows"]) if "rows" in spec.params else self.source.shape[0]
        row = int(np.prod(self.source.shape, dtype=np.int64)) // max(1, rows)
        for piece in self._pieces(row, _ROW_BLOCKS.get(spec.layout, rows)):
            params = dict(spec.params)
            if "rows" in params:  # a 1-D tensor of `rows` rows: this slice's count
                params["rows"] = piece.size // row
            raw = memoryview(np.ascontiguousarray(layout.forward(piece, **params))
                             .reshape(-1).view(np.uint8))
            for at in range(0, len(raw), max(1, chunk_bytes)):
                yield raw[at:at + chunk_bytes]
        stats = getattr(self.source, "_stats", None) if is_lazy(self.source) else None
        if stats is not None:  # checkpoint tensors streamed out, in the kernel's layout
            stats.tensors += len(getattr(self.source, "parts", ())) or 1

    def _pieces(self, row: int, block: int) -> Iterator[np.ndarray]:
        """The source in slices of whole blocks of `block` rows, shaped as the source."""
        rest = () if "rows" in self.spec.params else tuple(self.source.shape)[1:]
        unit = max(1, block * row)
        if is_lazy(self.source):
            pieces = (to_numpy(p) for p in self.source.slices(unit))
        else:
            flat = to_numpy(self.source).reshape(-1)
            step = max(1, SLICE_BYTES // (unit * flat.itemsize)) * unit
            pieces = (flat[at:at + step] for at in range(0, flat.size, step))
        for piece in pieces:
            yield piece.reshape(-1, *rest) if rest else piece


def _weight_spec(graph: Graph, name: str):
    value = graph.weights[name]
    if not all(symbolic.is_static(d) for d in value.type.shape):
        raise DayzeroError(f"weight '{name}' has a symbolic shape {value.type}", f"weight {name}",
                           "weights must have static shapes")
    if name not in graph.weight_data:
        raise DayzeroError(f"weight '{name}' has no data in graph.weight_data", f"weight {name}",
                           "load or export the model's weights before writing the artifact")
    return value.type.dtype, tuple(int(d) for d in value.type.shape)


def _derived_spec(graph: Graph, name: str, spec: DerivedWeight):
    """The stored dtype and shape of a derived tensor, its declaration checked."""
    where, fix = f"derived weight {name}", "report this as a dayzero bug (the backend's plan)"
    if name in graph.weights:
        raise DayzeroError(f"derived weight '{name}' has the name of a graph weight", where, fix)
    layout = WEIGHT_LAYOUTS.get(spec.layout)
    if spec.source not in graph.weights or layout is None:
        raise DayzeroError(f"derived weight '{name}' names source '{spec.source}' and layout "
                           f"'{spec.layout}'; the graph or the layout table has no such entry",
                           where, fix)
    if layout.arguments(spec.params) is None:
        raise DayzeroError(f"derived weight '{name}' gives layout '{spec.layout}' parameters "
                           f"{dict(spec.params)}; it takes {list(layout.params)} (positive ints)",
                           where, fix)
    dtype, shape = _weight_spec(graph, spec.source)
    stored = layout.shape(shape, **spec.params)
    if stored is None:
        raise DayzeroError(f"layout '{spec.layout}' {dict(spec.params)} does not fit weight "
                           f"'{spec.source}' of shape {list(shape)}", where, fix)
    return dtype, tuple(stored)


def _nbytes(dtype, shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
