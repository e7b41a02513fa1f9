"""dayzero's compiler: IR, torch.export frontend, checkpoint loading, compile driver and CLI.

`compile`, `export` and `ir` are loaded on first use, so that `import compiler.errors` (the error
classes the runtime raises) stays free of the IR, torch.export and the passes.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import DayzeroError

# public name -> (submodule, attribute or None for the submodule itself)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "compile": ("driver", "compile"),
    "export": ("frontend", "export"),
    "ir": ("ir", None),
}

__all__ = ["DayzeroError", "compile", "export", "ir"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'compiler' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = importlib.import_module(f"{__name__}.{module}")
    return value if attr is None else getattr(value, attr)
