"""The ATen conversion table: ATen overload name -> small function that emits IR for it.

A converter gets the `AtenEmitter` and the node's arguments bound to the overload's schema names
(`a["self"]`, `a["dim"]`, defaults filled in; tensors as IR Values, sizes as ints or sympy
expressions) and returns the node's result: a Value, a tuple of Values for a multi-result overload
(None where the IR has no equivalent, e.g. max_pool's indices), or None for a dropped node. It
raises `Unsupported` for argument combinations the IR cannot express. The set of names in this
table is also what `decompositions.py` keeps whole when torch decomposes the program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..emitter import AtenEmitter

Converter = Callable[[AtenEmitter, dict[str, Any]], Any]

CONVERTERS: dict[str, Converter] = {}
TARGETS: dict[str, str] = {}  # ATen overload -> IR op(s) it becomes, for docs/ops.md


def converts(*names: str, ir: str = "") -> Callable[[Converter], Converter]:
    """Register `fn` for ATen overloads given as `op.overload` (the `aten.` prefix is implied)."""
    def register(fn: Converter) -> Converter:
        for name in names:
            key = f"aten.{name}"
            if key in CONVERTERS:
                raise ValueError(f"ATen overload {key} has two converters")
            CONVERTERS[key] = fn
            TARGETS[key] = ir
        return fn
    return register


def register_many(names: dict[str, str], factory: Callable[[str], Converter],
                  ir: Callable[[str], str] = lambda target: target) -> None:
    """Register `factory(target)` for each `overload -> target` pair of a family table."""
    for name, target in names.items():
        converts(name, ir=ir(target))(factory(target))
