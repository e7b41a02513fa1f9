"""Checks shared by the fusion rules: trailing reduction dims, shape fits, activation names."""

from __future__ import annotations

from typing import Any

from compiler.ir import Value, get_op
from compiler.ir.ops import ShapeError
from compiler.ir.ops.fused import ACTIVATIONS

from ..rewrite.match import same_dim


def trailing(dims: Any, rank: int) -> int | None:
    """k when `dims` are exactly the last k axes of a rank-`rank` tensor (any order), else None."""
    if not isinstance(dims, (list, tuple)) or not dims:
        return None
    axes = sorted(d % rank for d in dims if isinstance(d, int))
    if len(axes) != len(dims) or axes != list(range(rank - len(axes), rank)):
        return None
    return len(axes)


def last_axis(dim: Any, rank: int) -> bool:
    return isinstance(dim, int) and rank > 0 and dim % rank == rank - 1


def same_shape(a: Value, b: Value) -> bool:
    return a.type.rank == b.type.rank and all(same_dim(x, y) for x, y in zip(a.shape, b.shape))


def shape_is(value: Value | None, dims) -> bool:
    return value is not None and value.type.rank == len(dims) and all(
        same_dim(x, y) for x, y in zip(value.shape, dims))


def misfit(op: str, inputs: list[Value | None], **attrs: Any) -> str | None:
    """Why `op` cannot take these operands (its shape rule's message), or None when it can."""
    opdef = get_op(op)
    try:
        opdef.infer([None if v is None else v.type for v in inputs], opdef.complete_attrs(attrs))
    except ShapeError as exc:
        return f"{op} cannot take these operands: {exc}"
    return None


# (op, approximate attribute or None) -> activation name, the inverse of ACTIVATIONS
_ACTIVATION_OF = {(spec[0], spec[1].get("approximate")): name
                  for name, spec in ACTIVATIONS.items() if spec is not None}


def activation_name(value: Value) -> str | None:
    """The ACTIVATIONS name of the unary op producing `value`, if it is one."""
    node = value.producer
    if node is None:
        return None
    return _ACTIVATION_OF.get((node.op, node.attrs.get("approximate")))


ACTIVATION_OPS = sorted({spec[0] for spec in ACTIVATIONS.values() if spec is not None})
