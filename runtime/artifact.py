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
other files, while the manifest is read strictly (`runtime.manifest`: never through a link,
bounded, every field typed and ranged, its paths inside the folder and listed) and checked at
load against the graph it describes (`runtime.consistency`). Proving that a whole artifact is
the one that was published needs a hash or signature of manifest.json kept outside it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from backends import WeightLocation
from compiler.errors import ArtifactError

from . import safetensors_io as st
from .manifest import FORMAT_NAME, FORMAT_VERSION, MANIFEST, FileEntry, Manifest, read_manifest
from .manifest_fields import relpath

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MANIFEST", "Artifact", "open_artifact",
           "safe_relpath"]
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
        # the typed, validated manifest; `manifest` is its JSON object, which most callers
        # still index directly
        self.typed: Manifest = read_manifest(self.root)
        self.manifest: dict[str, Any] = self.typed.raw
        self._ranks = self.manifest["parallel"]["ranks"]
        weight_files = {f for r in self.typed.parallel.ranks for f in r.weights}
        mine = weight_files if rank is None else set(self._rank(rank)["weights"])
        _check_files(self.root, self.typed.files, verify, weight_files, weight_files - mine)
        self._entries = {f: st.read_header(self.file(f, "weight file"), f) for f in sorted(mine)}
        self._maps: dict[tuple[str, str], np.memmap] = {}
        self._consistent: dict[str, Any] | None = None

    def check_consistency(self, input_specs=None, output_specs=None) -> dict[str, Any]:
        """The manifest against graph.dzir (`runtime.consistency`), once: its specs (these,
        else the manifest's), symbols and index ranges; returns the graph's index ranges.
        For a loader whose backend does not parse and check the graph itself."""
        if self._consistent is None:
            from .consistency import check_against_graph_text

            self._consistent = check_against_graph_text(
                self, self.typed.inputs if input_specs is None else input_specs,
                self.typed.outputs if output_specs is None else output_specs)
        return self._consistent

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
        return self._text(self._rank(rank)["graph"], "rank graph")

    def global_graph_text(self) -> str:
        """The manifest's top-level `graph`: for a partitioned artifact the annotated global
        graph (inspection only), else the one graph."""
        return self._text(self.manifest["graph"], "graph")

    def _text(self, relpath: str, what: str) -> str:
        """A listed text file, which must be UTF-8 (IR text is)."""
        data = self.file(relpath, what).read_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"{relpath} is not UTF-8 text (byte {exc.start}: "
                                f"{exc.reason})", str(self.root / relpath),
                                "the artifact is corrupted or was edited; recompile it") from None

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
    """manifest.json read and validated (`runtime.manifest`), as its JSON object: for the
    callers that only need the format checked before they open the artifact for a rank."""
    return read_manifest(Path(root)).raw


def _check_files(root: Path, listed: Mapping[str, FileEntry], verify: str,
                 weight_files: set[str],
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
        if size != info.size:
            raise ArtifactError(f"file {rel} is {size} bytes, the manifest says {info.size}",
                                str(path), "the artifact is corrupted or truncated; recompile it")
        if rel not in foreign and (verify == "full" or rel not in weight_files):
            if _sha256(path) != info.sha256:
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
    """A relative POSIX path that stays inside its folder (no absolute paths, no '..') and that
    the file system takes (bounded length): `runtime.manifest_fields.relpath`."""
    return relpath(rel, what)
