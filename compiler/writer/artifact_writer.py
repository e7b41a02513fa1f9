"""Writing an artifact (the layout is described in `runtime.artifact`, which reads it).

Compile time, not runtime: the writer calls the backend's `lower`, so it sits above the backends
and the runtime's format modules, and a machine that only runs artifacts never imports it.

The writer builds everything in a temporary sibling folder and renames it into place, so a failed
compile leaves nothing behind and `force` replaces an old artifact only once the new one is
complete. It deletes, renames or overwrites only what it made: the temporary folder carries its
marker (`runtime.stale_dirs`) from its first moment, the sweep of folders that killed writers
left removes only marked ones whose writer is provably gone, and `force` replaces only a
dayzero artifact (or an empty folder), never a file or a folder holding anything else.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import backends
from backends import Backend
from compiler.errors import DayzeroError
from compiler.ir import Graph, print_ir, symbolic
from compiler.ir.collector import collection_paused
from runtime.artifact import (
    FORMAT_NAME,
    FORMAT_VERSION,
    GRAPH,
    MANIFEST,
    PAYLOAD_DIR,
    safe_relpath,
)
from runtime.index_inputs import index_inputs_json
from runtime.stale_dirs import MARKER, make_marked_dir, sweep, unmark

from .hashed_files import derived_manifest, put_file, write_weights
from .rank_writer import write_ranks

DEFAULT_SHARD_BYTES = 2 * 2**30

# Keys the writer owns; `manifest_extra` may add others (pipeline, config, ...) but not these.
_OWN_KEYS = frozenset({"format", "format_version", "producer", "producer_version", "backend",
                       "backend_options", "graph", "inputs", "outputs", "symbols", "files",
                       "index_inputs", "derived_weights"})

# -- writing -----------------------------------------------------------------------------------

def write_artifact(out: str | Path, graph: Graph, backend: Backend | str, *,
                   options: Mapping[str, Any] | None = None,
                   manifest_extra: Mapping[str, Any] | None = None, force: bool = False,
                   progress: Callable[[int], Any] | None = None,
                   shard_bytes: int = DEFAULT_SHARD_BYTES,
                   ranks: Sequence[Any] | None = None,
                   extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Write `graph` (with `graph.weight_data`) lowered by `backend` as an artifact at `out`.

    `progress` is called with the number of weight bytes written after each tensor. Without
    `force` an existing `out` is refused; with it, an existing artifact (or empty folder) is
    replaced once the new one is complete. Returns `out` as a Path.

    `ranks` (objects with `rank`, `coords` and `graph`, one per rank of a partitioned model)
    writes one graph and one set of weight shards per rank instead (see `rank_writer`); `graph`
    is then the annotated global graph, stored as graph.dzir for inspection only.
    `extra_files` ({relative path: bytes}, e.g. a generation artifact's tokenizer/) are written
    and hashed like every other file.
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
    sweep_stale_temps(out.parent)
    tmp = make_marked_dir(out.with_name(f".{out.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"),
                          TEMP_PURPOSE)
    files: dict[str, dict[str, Any]] = {}
    try:
        with removed_on_sigterm(tmp), collection_paused():  # lowering builds a second graph
            for rel, data in sorted((extra_files or {}).items()):
                put_file(tmp, _extra_path(rel), bytes(data), files)
            _write_into(tmp, out, graph, target, options, extra, force, progress, shard_bytes,
                        ranks, files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_into(tmp: Path, out: Path, graph: Graph, target: Backend, options: dict[str, Any],
                extra: dict[str, Any], force: bool, progress, shard_bytes: int, ranks,
                files: dict[str, dict[str, Any]]) -> None:
    if ranks is None:
        shard_files, derived = _fill(tmp, graph, target, options, files, progress, shard_bytes)
        if derived:
            extra["derived_weights"] = derived_manifest(derived)
    else:
        entries = write_ranks(tmp, ranks, target, options, files, progress, shard_bytes)
        put_file(tmp, GRAPH, print_ir(graph).encode(), files)
        extra["parallel"] = {**extra.get("parallel", {}), "ranks": entries}
        shard_files = []
    manifest = _manifest(graph, target.name, options, extra, shard_files, files)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    unmark(tmp)  # from here a kill leaves an unmarked folder: never swept, never an artifact
    _install(tmp, out, force)


# -- temporary folders: removed on SIGTERM, swept when their writer is gone ----------------------

_TEMP_NAME = re.compile(r"^\..+\.\d+-[0-9a-f]{8}\.tmp$")
TEMP_PURPOSE = "artifact-write"  # the marker's purpose: the sweep takes no other kind of folder


@contextlib.contextmanager
def removed_on_sigterm(path: Path):
    """While writing into `path`, SIGTERM removes it before the process ends as it would have.

    SIGKILL cannot be caught: the folder's marker records the writer, and the next write into
    the same parent sweeps it (`sweep_stale_temps`). Only the main thread can set handlers;
    elsewhere, and where SIGTERM is ignored, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        yield
        return

    def on_sigterm(signum, frame):
        shutil.rmtree(path, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:
            signal.raise_signal(signum)  # the default action: end with SIGTERM's status
        raise DayzeroError("the artifact write was stopped by SIGTERM", str(path),
                           "run the compile again")  # the program's handler returned

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def sweep_stale_temps(parent: Path) -> list[Path]:
    """Remove temporary artifact folders in `parent` left by killed writers; returns them.

    Only a folder named like the writer's that carries a writer's marker, of this user and
    host, whose writer provably no longer runs; an unmarked folder is not ours (whatever its
    name or age) and a running writer's is in use: both are kept.
    """
    return sweep(parent, _TEMP_NAME, TEMP_PURPOSE)


_RESERVED = frozenset({MANIFEST, MARKER})  # written by the writer itself


def _extra_path(rel: str) -> str:
    rel = safe_relpath(rel, "artifact file")
    if rel in _RESERVED:
        raise DayzeroError(f"an extra artifact file may not be named {rel}", rel,
                           "the writer writes that file itself; choose another name")
    return rel


def _fill(root: Path, graph: Graph, backend: Backend, options: dict[str, Any],
          files: dict[str, dict[str, Any]], progress, shard_bytes: int
          ) -> tuple[list[str], dict[str, Any]]:
    """Weights (those the backend wants in its kernels' layout computed as they are written),
    then the backend payload (it needs their locations), then the graph text. Returns the
    weight files and the derived weights written."""
    derived = dict(backend.derived_weights(graph, options))
    locations, shard_files = write_weights(root, graph, files, progress, shard_bytes,
                                           derived=derived)
    payload = backend.lower(graph, locations, options)
    for rel, data in sorted(payload.items()):
        if isinstance(data, str):
            data = data.encode()
        put_file(root, f"{PAYLOAD_DIR}/{safe_relpath(rel, 'backend payload')}", bytes(data),
                 files)
    put_file(root, GRAPH, print_ir(graph).encode(), files)
    return shard_files, derived


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
        "inputs": [value_spec(v) for v in graph.inputs],
        "outputs": [value_spec(v) for v in graph.outputs],
        "symbols": {name: [lo, hi] for name, (lo, hi) in graph.symbols.items()},
        "index_inputs": index_inputs_json(graph),
        "parallel": parallel,
        "pipeline": extra.pop("pipeline", None),
        **extra,
        "files": dict(sorted(files.items())),
    }


def value_spec(value) -> dict[str, Any]:
    """A graph input or output as the manifest lists it: name, dtype, shape with symbols."""
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


def check_destination(out: str | Path, force: bool, *, folder_ok: bool = False,
                      what: str = "output path") -> None:
    """Before any work: `out` can be written. An existing `out` needs `force` (and must be an
    artifact, or with `folder_ok` any folder); the nearest existing parent must be a folder
    in which a folder can be made (a probe finds read-only and pseudo file systems)."""
    out = Path(out)
    if folder_ok and out.is_dir():
        parent = out
    elif folder_ok and out.exists():
        raise DayzeroError(f"cannot write {what} {out}: it is a file, not a folder", str(out),
                           "choose a folder, or a path that does not exist yet")
    else:
        _check_target(out, force)
        parent = out.parent
    while not (parent.exists() or parent.is_symlink()) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise DayzeroError(f"cannot write {what} {out}: {parent} is a file, not a folder",
                           str(out), "choose an output path inside a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=parent))
    except OSError as exc:
        raise DayzeroError(f"cannot write {what} {out}: making a folder in {parent} fails "
                           f"({exc.strerror or exc})",
                           str(out), "choose a writable location") from None


def _check_target(out: Path, force: bool) -> None:
    if not (out.exists() or out.is_symlink()):
        return
    if not force:
        raise DayzeroError(f"output path {out} already exists", str(out),
                           "choose another path or pass --force (force=True) to replace it")
    problem = _not_replaceable(out)
    if problem is not None:
        raise DayzeroError(f"refusing to replace {out}: {problem}", str(out),
                           "--force replaces only a dayzero artifact (or an empty folder): "
                           "move or remove it yourself, or choose another output path")


MAX_MANIFEST_BYTES = 256 * 2**20  # far past any artifact's manifest; a bigger file is not one


def _not_replaceable(path: Path) -> str | None:
    """Why `force` may not replace `path` (None: it is an empty folder, or a dayzero artifact
    holding nothing but its own files: what goes with it is only what a compile wrote)."""
    if path.is_symlink():
        return "it is a symbolic link, not a dayzero artifact"
    if not path.is_dir():
        return "it is a file, not a dayzero artifact"
    if next(path.iterdir(), None) is None:
        return None
    manifest = _read_manifest_of(path / MANIFEST)
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or manifest.get("format") != FORMAT_NAME:
        return f"it is not a dayzero artifact (no {MANIFEST} of format {FORMAT_NAME})"
    foreign = _foreign_entry(path, set(listed))
    if foreign is not None:
        return f"it holds {foreign}, which is not a file of the artifact"
    return None


def _read_manifest_of(path: Path) -> Any:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _foreign_entry(root: Path, listed: set[str]) -> str | None:
    """The first entry under `root` that is neither manifest.json, nor a listed file, nor a
    folder on the way to one (a user's notes, a .git folder, an empty folder, a link)."""
    folders = {"/".join(rel.split("/")[:i]) for rel in listed for i in range(1, rel.count("/") + 1)}
    unreadable: list[OSError] = []
    for top, dirs, names in os.walk(root, onerror=unreadable.append):  # links not followed
        here = Path(top).relative_to(root).as_posix()
        prefix = "" if here == "." else f"{here}/"
        for name in dirs:
            if Path(top, name).is_symlink() or f"{prefix}{name}" not in folders \
                    and not _own_empty_folder(root, f"{prefix}{name}"):
                return f"{prefix}{name}/"
        for name in names:
            if f"{prefix}{name}" not in listed and f"{prefix}{name}" != MANIFEST:
                return f"{prefix}{name}"
    if unreadable:
        return f"{unreadable[0].filename}, which cannot be read"
    return None


# the folders a compile makes whatever it writes into them (a model without weights leaves
# weights/ empty): empty, they hold nothing of a user's
_LAYOUT_FOLDERS = frozenset({"weights", "backend", "tokenizer", "graphs"})


def _own_empty_folder(root: Path, rel: str) -> bool:
    path = root / rel
    try:
        return rel in _LAYOUT_FOLDERS and next(path.iterdir(), None) is None
    except OSError:
        return False


def _install(tmp: Path, out: Path, force: bool) -> None:
    """Rename the finished folder into place; an old artifact is renamed aside first, removed
    only once the new one is in place, and put back if that fails."""
    if not (out.exists() or out.is_symlink()):
        _rename(tmp, out)
        return
    _check_target(out, force)  # again: the folder may have changed during the compile
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    _rename(out, old)
    try:
        _rename(tmp, out)
    except BaseException:
        try:
            os.rename(old, out)
        except OSError as exc:
            raise DayzeroError(f"replacing {out} failed, and so did putting the old artifact "
                               f"back ({exc.strerror or exc})", str(old),
                               f"the old artifact is intact at {old}: move it back") from None
        raise
    shutil.rmtree(old, ignore_errors=True)


def _rename(source: Path, dest: Path) -> None:
    try:
        os.rename(source, dest)
    except OSError as exc:
        raise DayzeroError(f"cannot move {source.name} to {dest} ({exc.strerror or exc})",
                           str(dest), "check that nothing else writes there, and compile "
                           "again") from None
