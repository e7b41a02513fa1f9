"""dayzero's IR: graph, types, symbolic shapes, op table, text form and verifier.

Importing this package does not import torch; reference semantics import it when they run.
Names load on first use (PEP 562), so a reader that needs only the leaf modules (the runtime's
`compiler.ir.dtypes` and `compiler.ir.limits`, plain data without imports) does not pay for the
op table, sympy or the lark grammar: an ONNX Runtime artifact runs without them.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    "DType": "dtypes",
    "Graph": "graph", "Node": "graph", "Value": "graph",
    "OPS": "ops", "OpDef": "ops", "get_op": "ops",
    "parse_ir": "parser",
    "format_node": "printer", "print_ir": "printer",
    "Dim": "symbolic", "symbol": "symbolic",
    "TensorType": "types",
    "verify": "verifier",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # probes for module dunders (__wrapped__, ...) are no submodules
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    else:  # a submodule not imported yet (`compiler.ir.symbolic` after `import compiler.ir`)
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
