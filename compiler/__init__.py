"""dayzero's compiler: IR, torch.export frontend, checkpoint loading, compile driver and CLI.

`compile` and `export` are loaded on first use so that `import compiler.ir` (which the runtime
uses to read graphs) stays free of torch.export and the passes.
"""

from __future__ import annotations

from . import ir
from .errors import DayzeroError

__all__ = ["DayzeroError", "compile", "export", "ir"]


def __getattr__(name: str):
    if name == "compile":
        from .driver import compile

        return compile
    if name == "export":
        from .frontend import export

        return export
    raise AttributeError(f"module 'compiler' has no attribute {name!r}")
