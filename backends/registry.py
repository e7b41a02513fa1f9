"""Backend registry: built-in backends, plugins from entry points, and explicit registrations.

Backends are found by name only through this table, never by scanning files or subclasses
(ExecuTorch and Inductor register explicitly too). Classes are referenced as "module:Class"
strings and imported on first use, so `import backends` stays light: listing backends imports
none of them, and an artifact for one backend never imports another (or torch) to run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Union

from compiler.errors import DayzeroError

from .base import Backend

ENTRY_POINT_GROUP = "dayzero.backends"

BackendRef = Union[type[Backend], str]

# Backends that ship with dayzero, as "module:Class" so that nothing is imported to list them.
BUILTINS: dict[str, str] = {
    "reference": "backends.reference:ReferenceBackend",
    "onnxruntime": "backends.onnxruntime:OnnxRuntimeBackend",
    "triton": "backends.triton:TritonBackend",
}

# Backends registered at run time with `register`; they take precedence over entry points.
_registered: dict[str, BackendRef] = {}

_INSTALL_HINT = (
    "install a backend plugin (a package declaring an entry point in group "
    f"'{ENTRY_POINT_GROUP}', e.g. `pip install -e tests/plugin`), or call "
    "backends.register(name, cls); see docs/backends.md")


def register(name: str, cls: BackendRef) -> None:
    """Make backend `cls` (a Backend subclass or a "module:Class" string) available as `name`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"backend name must be a non-empty string, got {name!r}")
    if isinstance(cls, str):
        if ":" not in cls:
            raise ValueError(f"backend reference {cls!r} is not of the form 'module:Class'")
    elif not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"backend {name!r}: {cls!r} is not a subclass of backends.Backend")
    _registered[name] = cls


def unregister(name: str) -> None:
    """Forget a backend added with `register` (entry points and built-ins stay)."""
    _registered.pop(name, None)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _table() -> dict[str, BackendRef | importlib.metadata.EntryPoint]:
    """Every known backend by name; explicit registrations override plugins and built-ins."""
    table: dict[str, BackendRef | importlib.metadata.EntryPoint] = {}
    table.update(_entry_points())
    table.update(BUILTINS)
    table.update(_registered)
    return table


def available() -> list[str]:
    """Names of the installed backends (built-ins, entry points, registrations), sorted."""
    return sorted(_table())


def get(name: str) -> Backend:
    """A fresh instance of the backend registered as `name`."""
    table = _table()
    if name not in table:
        raise DayzeroError(f"unknown backend '{name}'; available: {', '.join(sorted(table))}",
                           f"backend {name}", _INSTALL_HINT)
    cls = _load_class(name, table[name])
    try:
        instance = cls()
    except DayzeroError:
        raise
    except Exception as exc:
        raise DayzeroError(f"backend '{name}' failed to start: {type(exc).__name__}: {exc}",
                           f"backend {name} ({cls.__module__}.{cls.__qualname__})",
                           "check that the backend's dependencies are installed") from exc
    if not instance.name:
        instance.name = name
    return instance


def _load_class(name: str, ref: BackendRef | importlib.metadata.EntryPoint) -> type[Backend]:
    where = f"backend {name} ({getattr(ref, 'value', ref)})"
    try:
        if isinstance(ref, importlib.metadata.EntryPoint):
            cls = ref.load()
        elif isinstance(ref, str):
            module, _, attr = ref.partition(":")
            cls = importlib.import_module(module)
            for part in attr.split("."):
                cls = getattr(cls, part)
        else:
            cls = ref
    except (ImportError, AttributeError) as exc:
        raise DayzeroError(f"backend '{name}' is registered but cannot be imported: {exc}", where,
                           _import_fix(name, ref, exc)) from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise DayzeroError(f"backend '{name}' refers to {cls!r}, which is not a Backend subclass",
                           where, "point the entry point at a subclass of backends.Backend")
    return cls


def _import_fix(name: str, ref: BackendRef | importlib.metadata.EntryPoint, exc: Exception) -> str:
    """A built-in backend whose own module is absent is not installed at all: the runtime-only
    distribution (packaging/runtime) ships the onnxruntime backend alone."""
    module = BUILTINS.get(name, "").partition(":")[0]
    missing = getattr(exc, "name", None) or ""
    if ref == BUILTINS.get(name) and missing and module.startswith(missing):
        return (f"this installation has no '{name}' backend (dayzero-runtime ships only "
                "onnxruntime); install dayzero to use it")
    return "install the backend's dependencies, or reinstall its package"
