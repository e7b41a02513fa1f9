"""The artifact on disk, in one module: its layout, the writer the compile driver calls, the reader.

```
model.dz/
  manifest.json            format name/version, producer, backend and its options, input/output
                           specs, symbol ranges, parallel layout, pipeline, size+sha256 of every
                           other file
  graph.dzir               the final IR as text
  weights/*.safetensors    the weights, sharded (per rank under weights/rank-N/ when partitioned)
  backend/...              the backend's payload
```

The writer builds everything in a temporary sibling folder and renames it into place, so a failed
compile leaves nothing behind and `force` replaces an old artifact only once the new one is
complete. The reader trusts nothing: it checks the format version, every file's size and hash,
and the safetensors headers, and maps weights with mmap. No pickle, nothing in it is executed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

import backends
from backends import Backend, WeightLocation
from compiler.errors import ArtifactError, DayzeroError
from compiler.ir import Graph, print_ir, symbolic

from . import safetensors_io as st

FORMAT_NAME = "dayzero-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
GRAPH = "graph.dzir"
WEIGHTS_DIR = "weights"
PAYLOAD_DIR = "backend"
DEFAULT_SHARD_BYTES = 2 * 2**30
VERIFY_MODES = ("full", "size")

# Keys the writer owns; `manifest_extra` may add others (pipeline, config, ...) but not these.
_OWN_KEYS = frozenset({"format", "format_version", "producer", "producer_version", "backend",
                       "backend_options", "graph", "inputs", "outputs", "symbols", "files"})
_HASH_CHUNK = 8 * 2**20


# -- writing -----------------------------------------------------------------------------------

def write_artifact(out: str | Path, graph: Graph, backend: Backend | str, *,
                   options: Mapping[str, Any] | None = None,
                   manifest_extra: Mapping[str, Any] | None = None, force: bool = False,
                   progress: Callable[[int], Any] | None = None,
                   shard_bytes: int = DEFAULT_SHARD_BYTES,
                   ranks: Sequence[Any] | None = None) -> Path:
    """Write `graph` (with `graph.weight_data`) lowered by `backend` as an artifact at `out`.

    `progress` is called with the number of weight bytes written after each tensor. Without
    `force` an existing `out` is refused; with it, an existing artifact (or empty folder) is
    replaced once the new one is complete. Returns `out` as a Path.

    `ranks` (objects with `rank`, `coords` and `graph`, one per rank of a partitioned model)
    writes one graph and one set of weight shards per rank instead (see `rank_files`); `graph`
    is then the annotated global graph, stored as graph.dzir for inspection only.
    """
    out = Path(out)
    target = backends.get(backend) if isinstance(backend, str) else backend
    options = dict(options or {})
    extra = dict(manifest_extra or {})
    _check_json(options, "backend options")
    _check_json(extra, "manifest_extra")
    clash = sorted(_OWN_KEYS & set(extra))
    if clash:
        raise ValueError(f"manifest_extra may not set {clash}; the writer owns those keys")
    _check_target(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()  # not tempfile.mkdtemp: the artifact keeps the user's umask, not mode 0700
    try:
        files: dict[str, dict[str, Any]] = {}
        if ranks is None:
            shard_files = _fill(tmp, graph, target, options, files, progress, shard_bytes)
        else:
            from .rank_files import write_ranks

            entries = write_ranks(tmp, ranks, target, options, files, progress, shard_bytes)
            _put(tmp, GRAPH, print_ir(graph).encode(), files)
            extra["parallel"] = {**extra.get("parallel", {}), "ranks": entries}
            shard_files = []
        manifest = _manifest(graph, target.name, options, extra, shard_files, files)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _install(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _fill(root: Path, graph: Graph, backend: Backend, options: dict[str, Any],
          files: dict[str, dict[str, Any]], progress, shard_bytes: int) -> list[str]:
    """Weights, then the backend payload (it needs their locations), then the graph text."""
    locations, shard_files = _write_weights(root, graph, files, progress, shard_bytes)
    payload = backend.lower(graph, locations, options)
    for rel, data in sorted(payload.items()):
        if isinstance(data, str):
            data = data.encode()
        _put(root, f"{PAYLOAD_DIR}/{_safe_relpath(rel, 'backend payload')}", bytes(data), files)
    _put(root, GRAPH, print_ir(graph).encode(), files)
    return shard_files


def _put(root: Path, rel: str, data: bytes, files: dict[str, dict[str, Any]]) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_weights(root: Path, graph: Graph, files: dict[str, dict[str, Any]], progress,
                   shard_bytes: int, folder: str = WEIGHTS_DIR
                   ) -> tuple[dict[str, WeightLocation], list[str]]:
    specs = {name: _weight_spec(graph, name) for name in graph.weights}
    sizes = [(name, _nbytes(*spec)) for name, spec in specs.items()]
    shards = st.plan_shards(sizes, shard_bytes)
    (root / folder).mkdir(parents=True)
    locations: dict[str, WeightLocation] = {}
    shard_files = []
    for index, names in enumerate(shards):
        rel = f"{folder}/model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        entries, digest, size = st.write_file(root / rel, {n: specs[n] for n in names},
                                              graph.weight_data, progress)
        files[rel] = {"size": size, "sha256": digest}
        shard_files.append(rel)
        for e in entries:
            locations[e.name] = WeightLocation(rel, e.begin, e.nbytes, e.dtype.value, e.shape)
    return locations, shard_files


def _weight_spec(graph: Graph, name: str):
    value = graph.weights[name]
    if not all(symbolic.is_static(d) for d in value.type.shape):
        raise DayzeroError(f"weight '{name}' has a symbolic shape {value.type}", f"weight {name}",
                           "weights must have static shapes")
    if name not in graph.weight_data:
        raise DayzeroError(f"weight '{name}' has no data in graph.weight_data", f"weight {name}",
                           "load or export the model's weights before writing the artifact")
    return value.type.dtype, tuple(int(d) for d in value.type.shape)


def _nbytes(dtype, shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _manifest(graph: Graph, backend: str, options: dict[str, Any], extra: dict[str, Any],
              shard_files: list[str], files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    parallel = {"world_size": 1, "tensor_parallel": 1, "pipeline_parallel": 1,
                "data_parallel": 1,
                "ranks": [{"rank": 0, "graph": GRAPH, "weights": shard_files}]}
    parallel.update(extra.pop("parallel", {}))
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "producer": "dayzero",
        "producer_version": _producer_version(),
        "backend": backend,
        "backend_options": options,
        "graph": GRAPH,
        "inputs": [_spec(v) for v in graph.inputs],
        "outputs": [_spec(v) for v in graph.outputs],
        "symbols": {name: [lo, hi] for name, (lo, hi) in graph.symbols.items()},
        "parallel": parallel,
        "pipeline": extra.pop("pipeline", None),
        **extra,
        "files": dict(sorted(files.items())),
    }


def _spec(value) -> dict[str, Any]:
    shape = [d if isinstance(d, int) else symbolic.dim_str(d) for d in value.type.shape]
    return {"name": value.name, "dtype": value.type.dtype.value, "shape": shape}


def _producer_version() -> str:
    try:
        return importlib.metadata.version("dayzero")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _check_json(value: Any, what: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DayzeroError(f"{what} cannot be stored in manifest.json: {exc}", what,
                           "use only strings, numbers, booleans, null, lists and dicts") from None


def _check_target(out: Path, force: bool) -> None:
    if not (out.exists() or out.is_symlink()):
        return
    if not force:
        raise DayzeroError(f"output path {out} already exists", str(out),
                           "choose another path or pass --force (force=True) to replace it")
    if out.is_symlink() or not out.is_dir() or not _is_artifact_or_empty(out):
        raise DayzeroError(f"refusing to replace {out}: it is not a dayzero artifact", str(out),
                           "remove it yourself or choose another output path")


def _is_artifact_or_empty(path: Path) -> bool:
    if not any(path.iterdir()):
        return True
    try:
        return json.loads((path / MANIFEST).read_text()).get("format") == FORMAT_NAME
    except (OSError, ValueError, AttributeError):
        return False


def _install(tmp: Path, out: Path, force: bool) -> None:
    """Rename the finished folder into place; an old artifact goes only after that succeeded."""
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)
        return
    _check_target(out, force)
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


# -- reading -----------------------------------------------------------------------------------

class Artifact:
    """A verified artifact directory (implements backends.base.ArtifactView).

    `verify="full"` hashes every file; `verify="size"` checks sizes and safetensors headers of
    weight files but hashes only the other files, for multi-gigabyte weights loaded often.
    """

    def __init__(self, path: str | Path, verify: str = "full", rank: int | None = None):
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        self.root = Path(path)
        self.rank = rank
        self.manifest: dict[str, Any] = _read_manifest(self.root)
        self._ranks = _ranks(self.manifest)
        weight_files = {f for r in self._ranks for f in r["weights"]}
        mine = weight_files if rank is None else set(self._rank(rank)["weights"])
        _check_files(self.root, self.manifest["files"], verify, weight_files, weight_files - mine)
        self._entries = {f: st.read_header(self.root / f, f) for f in sorted(mine)}
        self._maps: dict[tuple[str, str], np.memmap] = {}

    def __repr__(self) -> str:
        return f"Artifact({str(self.root)!r}, backend={self.backend!r})"

    @property
    def backend(self) -> str:
        return self.manifest["backend"]

    @property
    def backend_options(self) -> dict[str, Any]:
        return self.manifest.get("backend_options", {})

    def graph_text(self, rank: int | None = None) -> str:
        return (self.root / self._rank(rank)["graph"]).read_text()

    def payload_path(self, relpath: str) -> Path:
        """Path of a payload file under backend/ (which must be listed in the manifest)."""
        rel = f"{PAYLOAD_DIR}/{_safe_relpath(relpath, 'payload path')}"
        if rel not in self.manifest["files"]:
            raise ArtifactError(f"the artifact has no payload file {rel}", str(self.root / rel),
                                "recompile the artifact with this backend")
        return self.root / rel

    def weight_locations(self, rank: int | None = None) -> dict[str, WeightLocation]:
        """Where each weight's bytes are, the same locations the backend's lower() was given."""
        return {name: WeightLocation(file, e.begin, e.nbytes, e.dtype.value, e.shape)
                for file, name, e in self._rank_entries(rank)}

    def weights(self, framework: str = "np", rank: int | None = None) -> dict[str, Any]:
        """Weights as numpy arrays ("np", read-only) or torch tensors ("torch"), mapped in place.

        Torch tensors sit on a private copy-on-write mapping: writing to one never reaches the
        file. Nothing is read from disk until a tensor is used.
        """
        if framework not in ("np", "torch"):
            raise ValueError(f"framework must be 'np' or 'torch', got {framework!r}")
        view = _numpy_view if framework == "np" else _torch_view
        mode = "r" if framework == "np" else "c"
        return {name: view(self._map(file, mode), e) for file, name, e in self._rank_entries(rank)}

    def _map(self, file: str, mode: str) -> np.memmap:
        key = (file, mode)
        if key not in self._maps:
            self._maps[key] = np.memmap(self.root / file, dtype=np.uint8, mode=mode)
        return self._maps[key]

    def _rank(self, rank: int | None) -> dict[str, Any]:
        """A rank's manifest entry; None is the rank the artifact was opened for (else 0)."""
        rank = (self.rank or 0) if rank is None else rank
        for entry in self._ranks:
            if entry["rank"] == rank:
                return entry
        raise ArtifactError(f"the artifact has no rank {rank}", str(self.root / MANIFEST),
                            f"ranks are {[r['rank'] for r in self._ranks]}")

    def _rank_entries(self, rank: int | None):
        seen: dict[str, str] = {}
        for file in self._rank(rank)["weights"]:
            if file not in self._entries:
                raise ArtifactError(f"{file} belongs to another rank than rank {self.rank}, "
                                    "which this artifact was opened for", str(self.root / file),
                                    "open the artifact for that rank (or for all ranks)")
            for name, entry in self._entries[file].items():
                if name in seen:
                    raise ArtifactError(f"weight '{name}' is stored twice", f"{seen[name]}, {file}",
                                        "recompile the artifact")
                seen[name] = file
                yield file, name, entry


def open_artifact(path: str | Path, verify: str = "full", rank: int | None = None) -> Artifact:
    """Open and verify an artifact directory; raises ArtifactError naming the offending file.

    With `rank`, only that rank's weight files are read (hashed, headers checked); the other
    ranks' weight files are checked for presence and size only.
    """
    return Artifact(path, verify=verify, rank=rank)


def _numpy_view(mm: np.memmap, e: st.TensorEntry) -> np.ndarray:
    return mm[e.begin:e.end].view(e.dtype.to_numpy()).reshape(e.shape)


def _torch_view(mm: np.memmap, e: st.TensorEntry):
    import torch

    raw = torch.from_numpy(mm[e.begin:e.end])
    if e.begin % e.dtype.itemsize:  # never for files we wrote; copy rather than fail
        raw = raw.clone()
    return raw.view(e.dtype.to_torch()).reshape(e.shape)


def _read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not root.is_dir():
        raise ArtifactError(f"{root} is not an artifact directory", str(root),
                            "give the folder written by `dayzero compile`")
    if not path.is_file():
        raise ArtifactError(f"{root} has no {MANIFEST}", str(path),
                            "give the folder written by `dayzero compile`, or recompile")
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{MANIFEST} is not valid JSON ({exc})", str(path),
                            "the artifact is corrupted; recompile it") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ArtifactError(f"{root} is not a dayzero artifact (format {found!r})", str(path),
                            "give the folder written by `dayzero compile`")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(
            f"artifact format version {version!r} is not supported; this dayzero reads version "
            f"{FORMAT_VERSION}", str(path),
            f"recompile the model with this dayzero, or load it with the dayzero that wrote it "
            f"(producer version {manifest.get('producer_version', 'unknown')})")
    _check_keys(manifest, path)
    return manifest


_KEY_TYPES = {"backend": str, "inputs": list, "outputs": list, "symbols": dict, "files": dict,
              "parallel": dict, "graph": str}


def _check_keys(manifest: dict[str, Any], path: Path) -> None:
    for key, kind in _KEY_TYPES.items():
        if not isinstance(manifest.get(key), kind):
            raise ArtifactError(f"{MANIFEST} has no valid '{key}' entry", str(path),
                                "the artifact is corrupted; recompile it")


def _ranks(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    ranks = manifest["parallel"].get("ranks")
    ok = isinstance(ranks, list) and ranks and all(
        isinstance(r, dict) and isinstance(r.get("rank"), int) and isinstance(r.get("graph"), str)
        and isinstance(r.get("weights"), list) for r in ranks)
    if not ok:
        raise ArtifactError(f"{MANIFEST} has no valid parallel.ranks entry", MANIFEST,
                            "the artifact is corrupted; recompile it")
    listed = manifest["files"]
    for rel in [f for r in ranks for f in (r["graph"], *r["weights"])]:
        if rel not in listed:
            raise ArtifactError(f"{rel} is used by the artifact but not listed in {MANIFEST}", rel,
                                "the artifact is corrupted; recompile it")
    return ranks


def _check_files(root: Path, listed: dict[str, Any], verify: str, weight_files: set[str],
                 foreign: set[str] = frozenset()) -> None:
    """Every listed file exists with its size and hash; no unlisted file hides in the folder.

    Files in `foreign` (other ranks' weights) are checked for size only, never read.
    """
    inside = root.resolve()
    for rel, info in listed.items():
        path = root / _safe_relpath(rel, f"file listed in {MANIFEST}")
        if path.is_symlink() or (path.exists() and not path.resolve().is_relative_to(inside)):
            raise ArtifactError(f"file {rel} is a link or lies outside the artifact", str(path),
                                "an artifact holds plain files only; recompile it")
        if not path.is_file():
            raise ArtifactError(f"file {rel} listed in the manifest is missing", str(path),
                                "the artifact is incomplete; recompile it")
        size = path.stat().st_size
        if not isinstance(info, dict) or size != info.get("size"):
            expected = info.get("size") if isinstance(info, dict) else None
            raise ArtifactError(f"file {rel} is {size} bytes, the manifest says {expected}",
                                str(path), "the artifact is corrupted or truncated; recompile it")
        if rel not in foreign and (verify == "full" or rel not in weight_files):
            if _sha256(path) != info.get("sha256"):
                raise ArtifactError(f"file {rel} does not match its sha256 in the manifest",
                                    str(path), "the artifact was modified or corrupted; "
                                    "recompile it")
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_dir() or rel == MANIFEST or any(p.startswith(".") for p in Path(rel).parts):
            continue
        if rel not in listed:
            raise ArtifactError(f"file {rel} is not listed in the manifest", str(path),
                                "remove it, or recompile the artifact")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _safe_relpath(rel: Any, what: str) -> str:
    """A relative POSIX path that stays inside its folder (no absolute paths, no '..')."""
    parts = PurePosixPath(rel).parts if isinstance(rel, str) else ()
    if not parts or "/".join(parts) != rel or "\\" in rel or ".." in parts:
        raise ArtifactError(f"{what} {rel!r} is not a plain relative path", str(rel),
                            "paths in an artifact must stay inside it")
    return "/".join(parts)
