"""Which ATen ops torch decomposes before conversion: only those the op set lacks.

torch's default export decomposition table lowers everything to core ATen, which would split
model-level ops (linear, layer_norm, scaled_dot_product_attention, gelu, softmax, ...) that the IR
and the backends keep whole. We start from that table and remove every overload the conversion
table handles, so those stay whole and everything else is decomposed with torch's own rules.
"""

from __future__ import annotations

import functools

import torch
from torch.export import ExportedProgram

from .aten import CONVERTERS

# ATen overloads whose value is a size, not a tensor: never decomposed, never converted.
SIZE_OPS = frozenset({"aten.sym_size.int", "aten.sym_numel.default", "aten.sym_stride.int",
                      "aten.sym_storage_offset.default"})


def _overload(name: str):
    """torch.ops.aten.<op>.<overload> for 'aten.<op>.<overload>', or None if torch lacks it."""
    _, op, overload = name.split(".")
    packet = getattr(torch.ops.aten, op, None)
    return getattr(packet, overload, None) if packet is not None else None


@functools.cache
def _table() -> dict:
    table = torch.export.default_decompositions()
    for name in CONVERTERS:
        overload = _overload(name)
        if overload is not None and overload in table:
            table.pop(overload)
    return dict(table.items())


def decomposition_table() -> dict:
    """torch.export's default decomposition table minus the overloads we convert directly.

    A plain dict: run_decompositions keeps every CompositeImplicitAutograd op that is not a key,
    which is exactly the converted ones. A fresh copy each call, since torch edits it in place.
    """
    return dict(_table())


def decompose(program: ExportedProgram) -> ExportedProgram:
    """Decompose what the op set lacks; a program made only of converted ops is left as it is
    (run_decompositions would return the same graph, at a noticeable cost for small models)."""
    if all(_is_final(node.target) for node in program.graph.nodes if node.op == "call_function"):
        return program
    return program.run_decompositions(decomposition_table())


def _is_final(target) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return str(target) in CONVERTERS or str(target) in SIZE_OPS
    return not isinstance(target, torch._ops.HigherOrderOperator)


def kept_whole() -> list[str]:
    """The converted overloads that torch's table would otherwise decompose (for docs/ops.md)."""
    table = torch.export.default_decompositions()
    return sorted(n for n in CONVERTERS if (op := _overload(n)) is not None and op in table)
