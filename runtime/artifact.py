"""The artifact on disk: its layout and the reader (the writer, at compile time, is
`compiler.writer`).

```
model.dz/
  manifest.json            format name/version, producer, backend and its options, input/output
                           specs, symbol ranges, parallel layout, pipeline, size+sha256 of every
                           other file
  graph.dzir               the final IR as text
  weights/*.safetensors    the weights, sharded (per rank under weights/rank-N/ when partitioned)
  backend/...              the backend's payload
```

The reader trusts nothing: it checks the format version, every file's size and hash,
and the safetensors headers, and maps weights with mmap. No pickle, nothing in it is executed.
Every file is read through `Artifact.file`, which accepts only paths listed (and so checked).

manifest.json itself cannot carry its own hash: the hashes find corruption and edits of the
other files, while the manifest is protected only by being parsed strictly (its paths stay
inside the folder and must be listed). Proving that a whole artifact is the one that was
published needs a hash or signature of manifest.json kept outside the artifact.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from backends import WeightLocation
from compiler.errors import ArtifactError

from . import safetensors_io as st

FORMAT_NAME = "dayzero-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
GRAPH = "graph.dzir"
WEIGHTS_DIR = "weights"
PAYLOAD_DIR = "backend"
VERIFY_MODES = ("full", "size")

_HASH_CHUNK = 8 * 2**20


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
        self._entries = {f: st.read_header(self.file(f, "weight file"), f) for f in sorted(mine)}
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
        """A rank's graph (None: the rank opened for, else 0)."""
        return self.file(self._rank(rank)["graph"], "rank graph").read_text()

    def global_graph_text(self) -> str:
        """The manifest's top-level `graph`: for a partitioned artifact the annotated global
        graph (inspection only), else the one graph."""
        return self.file(self.manifest["graph"], "graph").read_text()

    def payload_path(self, relpath: str) -> Path:
        """Path of a payload file under backend/ (which must be listed in the manifest)."""
        rel = f"{PAYLOAD_DIR}/{safe_relpath(relpath, 'payload path')}"
        return self.file(rel, "payload file", fix="recompile the artifact with this backend")

    def file(self, rel: str, what: str = "file", fix: str = "the artifact is corrupted; "
             "recompile it") -> Path:
        """The one way to a file of the artifact: a plain relative path listed in the
        manifest, so checked when the artifact was opened (size and sha256, no links, inside
        the folder). Every reader (loader, backends, CLI) goes through here; a path taken from
        the manifest and joined by hand could name any file on the machine."""
        rel = safe_relpath(rel, f"{what} path")
        if rel not in self.manifest["files"]:
            raise ArtifactError(f"the artifact has no {what} {rel} (it is not listed in "
                                f"{MANIFEST})", str(self.root / rel), fix)
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
            self._maps[key] = np.memmap(self.file(file, "weight file"), dtype=np.uint8,
                                        mode=mode)
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
        manifest = json.loads(path.read_text(), parse_int=_json_int, parse_constant=_json_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ArtifactError(f"{MANIFEST} is not valid JSON ({what})", str(path),
                            "the artifact is corrupted; recompile it") from None
    if _depth(manifest) > MAX_JSON_DEPTH:
        raise ArtifactError(f"{MANIFEST} is nested more than {MAX_JSON_DEPTH} deep", str(path),
                            "the artifact is corrupted; recompile it")
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


MAX_JSON_DEPTH = 64  # a manifest is a few levels deep; deeper is not one of ours


MAX_JSON_INT_DIGITS = 100  # far past any size or offset; each field checks its own range


def _json_int(digits: str) -> int:
    """Integers in the manifest are sizes, offsets, ranks: a 5000-digit one (a raw ValueError
    from int(), or seconds of work below Python's limit) is refused unparsed."""
    if len(digits.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"integer {digits[:24]}... has more than {MAX_JSON_INT_DIGITS} digits")
    return int(digits)


def _json_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any) -> int:
    """Nesting depth of decoded JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


_KEY_TYPES = {"backend": str, "inputs": list, "outputs": list, "symbols": dict, "files": dict,
              "parallel": dict, "graph": str}
_OPTIONAL_KEY_TYPES = {"backend_options": dict, "memory_plan": dict, "generation": dict,
                       "static_sizes": dict, "export_refinements": dict}


def _check_keys(manifest: dict[str, Any], path: Path) -> None:
    for key, kind in _KEY_TYPES.items():
        if not isinstance(manifest.get(key), kind):
            raise ArtifactError(f"{MANIFEST} has no valid '{key}' entry", str(path),
                                "the artifact is corrupted; recompile it")
    for key, kind in _OPTIONAL_KEY_TYPES.items():
        if manifest.get(key) is not None and not isinstance(manifest[key], kind):
            raise ArtifactError(f"{MANIFEST}: '{key}' is {type(manifest[key]).__name__}, not "
                                f"{kind.__name__}", f"{path}: {key}",
                                "the artifact is corrupted; recompile it")


def _ranks(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    ranks = manifest["parallel"].get("ranks")
    ok = isinstance(ranks, list) and ranks and all(
        isinstance(r, dict) and type(r.get("rank")) is int and isinstance(r.get("graph"), str)
        and isinstance(r.get("weights"), list) and all(isinstance(f, str) for f in r["weights"])
        for r in ranks)
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
        path = root / safe_relpath(rel, f"file listed in {MANIFEST}")
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


def safe_relpath(rel: Any, what: str) -> str:
    """A relative POSIX path that stays inside its folder (no absolute paths, no '..')."""
    parts = PurePosixPath(rel).parts if isinstance(rel, str) else ()
    if not parts or "/".join(parts) != rel or "\\" in rel or ".." in parts:
        raise ArtifactError(f"{what} {rel!r} is not a plain relative path", str(rel),
                            "paths in an artifact must stay inside it")
    return "/".join(parts)
