"""dayzero's public API in one namespace: the top floor of the layering, importing every package
below it and imported by none of them.

    import dayzero
    path = dayzero.compile(model, example_inputs, out="m.dz", backend="onnxruntime")
    m = dayzero.load(path)
    graph = dayzero.export(model, example_inputs)
    dayzero.compile_checkpoint("ckpt/", out="m.dz")
    dayzero.ir.print_ir(graph); dayzero.backends.available(); dayzero.__version__

Names load on first use (PEP 562), so `import dayzero` costs nothing until one is touched and a
machine that only runs artifacts never imports torch.export through it. The packages it fronts
(`compiler`, `runtime`, `backends`, `passes`) keep working under their own names.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> (module, attribute or None for the module itself)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "compile": ("compiler.driver", "compile"),
    "export": ("compiler.frontend", "export"),
    "compile_checkpoint": ("compiler.checkpoint", "compile_checkpoint"),
    "load": ("runtime", "load"),
    "DayzeroError": ("compiler.errors", "DayzeroError"),
    "ir": ("compiler.ir", None),
    "backends": ("backends", None),
    "passes": ("passes", None),
    "runtime": ("runtime", None),
}

__all__ = sorted([*_EXPORTS, "__version__"])


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("dayzero")
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        from compiler.cli import version

        return version()


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = _version()
    elif name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = importlib.import_module(module)
        if attr is not None:
            value = getattr(value, attr)
    else:
        raise AttributeError(f"module 'dayzero' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
