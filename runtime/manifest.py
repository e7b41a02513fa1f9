"""manifest.json, read as untrusted data into a typed, validated `Manifest`.

The manifest is the one file of an artifact without a hash (it holds the others'), so it is
read as strictly as every other file and more: opened without following a link (a
`manifest.json` that is a symlink to a file outside the artifact is refused, as any other
listed file is), at most MAX_MANIFEST_BYTES, its JSON nesting measured before parsing
(`bounded_json`), the format name and version checked, then every field the runtime or
`dayzero inspect` reads is checked for type and range, each error naming its key path
(`manifest.json: parallel.world_size`), what was found, what was expected, and the fix.

What this proves is that the manifest is well-formed. That its fields agree with the graph and
the payload (input and output specs, index ranges, symbols, the generation settings) is
checked at load against graph.dzir (`runtime.consistency`, `runtime.graph_checks`).

`Manifest.raw` is the validated JSON object, which `Artifact.manifest` still hands to the
callers that index it directly; the typed fields are what new code reads.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compiler.errors import ArtifactError

from . import bounded_json
from . import manifest_fields as mf
from .generation.spec import GenerationSpec, read_generation
from .index_inputs import IndexRange, read_index_inputs
from .manifest_fields import At
from .specs import TensorSpec, specs_from_manifest, symbol_ranges

FORMAT_NAME = "dayzero-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 * 2**20  # a manifest is kilobytes; the communication report the most
MAX_JSON_DEPTH = 64              # a few levels deep; deeper is not one of ours
MAX_JSON_INT_DIGITS = 100        # far past any size or offset; each field checks its own range
MAX_WORLD_SIZE = 65536           # far beyond any real job; bounds what an edit can launch
_BACKEND = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_CORRUPT = "the artifact is corrupted; recompile it"


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class RankEntry:
    rank: int
    graph: str
    weights: tuple[str, ...]
    coords: Mapping[str, int] = field(default_factory=dict)
    segments: int = 1


@dataclass(frozen=True)
class Parallel:
    world_size: int
    ranks: tuple[RankEntry, ...]
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: int = 1
    groups: Mapping[str, list[list[int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    """Every field of manifest.json the runtime reads, checked (see the module docstring)."""

    raw: Mapping[str, Any]
    backend: str
    backend_options: Mapping[str, Any]
    graph: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    symbols: Mapping[str, tuple[int, int | None]]
    index_inputs: Mapping[str, IndexRange]
    parallel: Parallel
    files: Mapping[str, FileEntry]
    generation: GenerationSpec | None = None
    producer_version: str = "unknown"
    pipeline: str | None = None

    @property
    def partitioned(self) -> bool:
        return self.parallel.world_size > 1


def read_manifest(root: Path) -> Manifest:
    """The manifest of the artifact folder `root`, read and validated; ArtifactError else."""
    return parse_manifest(_read_bytes(Path(root)), Path(root) / MANIFEST)


def parse_manifest(data: bytes, path: Path | str = MANIFEST) -> Manifest:
    """A manifest from its bytes (`path` names it in errors)."""
    try:
        raw = bounded_json.loads(data, max_depth=MAX_JSON_DEPTH,
                                 max_int_digits=MAX_JSON_INT_DIGITS)
    except ValueError as exc:
        raise ArtifactError(f"{MANIFEST} is not valid JSON ({str(exc)[:200]})", str(path),
                            _CORRUPT) from None
    _check_format(raw, path)
    return _typed(raw)


def _read_bytes(root: Path) -> bytes:
    """manifest.json's bytes: a regular file in `root` itself, never through a link."""
    path = root / MANIFEST
    try:
        is_dir = root.is_dir()
    except OSError:
        is_dir = False
    if not is_dir:
        raise ArtifactError(f"{root} is not an artifact directory", str(root),
                            "give the folder written by `dayzero compile`")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _open_error(exc, root, path) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"{MANIFEST} is not a regular file", str(path),
                                "an artifact holds plain files only; recompile it")
        if info.st_size > MAX_MANIFEST_BYTES:
            raise ArtifactError(f"{MANIFEST} is {info.st_size} bytes, more than the "
                                f"{MAX_MANIFEST_BYTES} a manifest may have", str(path), _CORRUPT)
        return f.read(MAX_MANIFEST_BYTES + 1)


def _open_error(exc: OSError, root: Path, path: Path) -> ArtifactError:
    if exc.errno == errno.ENOENT:
        return ArtifactError(f"{root} has no {MANIFEST}", str(path),
                             "give the folder written by `dayzero compile`, or recompile")
    if exc.errno == errno.ELOOP:
        return ArtifactError(f"{MANIFEST} is a link", str(path),
                             "an artifact holds plain files only: copy the artifact, or "
                             "recompile it")
    return ArtifactError(f"cannot read {MANIFEST}: {exc.strerror or exc}", str(path),
                         "check the artifact's permissions, or recompile it")


def _check_format(raw: Any, path: Path | str) -> None:
    found = raw.get("format") if isinstance(raw, dict) else None
    if found != FORMAT_NAME:
        shown = mf.short(found)
        raise ArtifactError(f"{Path(path).parent} is not a dayzero artifact (format {shown})",
                            str(path), "give the folder written by `dayzero compile`")
    version = raw.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        producer = raw.get("producer_version")
        producer = mf.short(producer) if not isinstance(producer, str) else producer[:64]
        raise ArtifactError(
            f"artifact format version {mf.short(version)} is not supported; this dayzero reads "
            f"version {FORMAT_VERSION}", str(path),
            f"recompile the model with this dayzero, or load it with the dayzero that wrote it "
            f"(producer version {producer})")


def _typed(raw: dict[str, Any]) -> Manifest:
    top = At()
    files = {rel: FileEntry(*entry) for rel, entry in mf.files(raw.get("files"), top / "files")
             .items()}
    graph = mf.listed(raw.get("graph"), top / "graph", files, "graph")
    symbols = symbol_ranges(raw)
    inputs = tuple(specs_from_manifest(raw, "inputs"))
    outputs = tuple(specs_from_manifest(raw, "outputs"))
    _unique(inputs, "inputs")  # (a graph may return one value twice: outputs may repeat)
    index = read_index_inputs(raw, [s.name for s in inputs])
    for key, check in (("backend_options", mf.fields), ("memory_plan", mf.fields),
                       ("static_sizes", mf.fields), ("export_refinements", mf.fields),
                       ("config", mf.fields), ("export_grouped_experts", mf.items)):
        mf.optional(raw, key, top, check)
    mf.optional(raw, "symbol_aliases", top, mf.aliases, symbols=symbols)
    generation = raw.get("generation")
    return Manifest(
        raw=raw, backend=mf.text(raw.get("backend"), top / "backend", 64, _BACKEND),
        backend_options=raw.get("backend_options") or {}, graph=graph, inputs=inputs,
        outputs=outputs, symbols=symbols, index_inputs=index,
        parallel=_parallel(raw.get("parallel"), top / "parallel", files),
        files=files,
        generation=None if generation is None else read_generation(generation, raw, files),
        producer_version=mf.optional(raw, "producer_version", top, mf.text, "unknown", limit=64),
        pipeline=mf.optional(raw, "pipeline", top, mf.text, limit=1 << 16))


def _unique(specs: tuple[TensorSpec, ...], key: str) -> None:
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise (At(key) / i / "name").error(f"repeats the name {mf.short(spec.name)}")
        seen.add(spec.name)


def _parallel(value: Any, at: At, files: Mapping[str, FileEntry]) -> Parallel:
    """`parallel`: the world size (it decides how many processes a launch starts) and exactly
    the ranks 0..world_size-1, each with its graph and weight files, all listed."""
    value = mf.fields(value, at)
    world = mf.whole(value.get("world_size", 1), at / "world_size", 1, MAX_WORLD_SIZE)
    ranks = []
    for i, entry in enumerate(mf.items(value.get("ranks"), at / "ranks", MAX_WORLD_SIZE)):
        where = at / "ranks" / i
        entry = mf.fields(entry, where)
        weights = mf.items(entry.get("weights"), where / "weights")
        ranks.append(RankEntry(
            mf.whole(entry.get("rank"), where / "rank", 0, MAX_WORLD_SIZE - 1),
            mf.listed(entry.get("graph"), where / "graph", files, "rank graph"),
            tuple(mf.listed(f, where / "weights" / j, files, "weight file")
                  for j, f in enumerate(weights)),
            mf.optional(entry, "coords", where, mf.coords, {}, world=world),
            mf.optional(entry, "segments", where, mf.whole, 1, lo=1, hi=1 << 16)))
    listed = sorted(r.rank for r in ranks)
    if listed != list(range(world)):
        shown = listed if len(listed) <= 8 else f"{listed[:8]} ... ({len(listed)} in all)"
        raise (at / "world_size").error(
            f"is {world} but the artifact lists ranks {shown} (parallel.ranks)",
            f"a world of {world} needs exactly ranks 0..{world - 1}; {mf.FIX}")
    sizes = {key: mf.optional(value, key, at, mf.whole, 1, lo=1, hi=world)
             for key in ("tensor_parallel", "pipeline_parallel", "data_parallel",
                         "expert_parallel")}
    mf.optional(value, "stages", at, mf.stages)
    if len(value.get("stages") or ()) > 1:
        mf.number(value.get("imbalance"), at / "imbalance")
    for key, check in (("pipeline", mf.text), ("mesh_order", mf.items),
                       ("communication", mf.fields)):
        mf.optional(value, key, at, check)
    return Parallel(world, tuple(ranks), **sizes,
                    groups=mf.optional(value, "groups", at, mf.groups, {}, world=world))
