"""The op table: one declaration per op, read by every part of the compiler.

An `OpDef` says what an op takes (named inputs, optional `name?`, variadic last `names*`), its
attributes with defaults, how its output types follow from its input types (`infer`), what it
computes (`reference`, in torch, on concrete attributes), and its class (`kind`) that passes and
backends group ops by. Nothing else in the code base switches on op names to learn these facts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..types import TensorType

REQUIRED = object()

# Op classes that passes and backends key on.
KINDS = frozenset({
    "elementwise", "reduction", "normalization", "matmul", "attention", "view", "data_movement",
    "creation", "indexing", "convolution", "pooling", "fused", "collective", "other",
})


# Attributes any node may carry that record provenance, not meaning: `origin` (the export-level
# nodes a fused node replaced, "%name op") and `fusion_group` (the id of the group of nodes a
# kernel generator emits as one kernel). Shape rules ignore them and `reference` never receives
# them (unless an op declares an attribute of that name itself).
META_ATTRS = ("origin", "fusion_group")


class ShapeError(ValueError):
    """Operand types an op cannot accept; the verifier adds where it happened."""


@dataclass(frozen=True)
class OpDef:
    name: str
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    infer: Callable[[list[TensorType | None], dict[str, Any]], list[TensorType]]
    reference: Callable[..., Any]
    kind: str
    summary: str
    commutative: bool = False
    aten: tuple[str, ...] = field(default=())

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name}: unknown kind {self.kind}")
        meta = tuple(name for name in META_ATTRS if name not in self.attrs)
        object.__setattr__(self, "reference", _without_meta(self.reference, meta))

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("*")

    def check_arity(self, count: int) -> None:
        fixed = [p for p in self.inputs if not p.endswith("*")]
        required = [p for p in fixed if not p.endswith("?")]
        if count < len(required) or (not self.variadic and count > len(fixed)):
            raise ShapeError(f"{self.name} takes inputs ({', '.join(self.inputs)}), got {count}")

    def complete_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Fill defaults; reject unknown and missing attributes."""
        unknown = set(attrs) - set(self.attrs) - set(META_ATTRS)
        if unknown:
            raise ShapeError(f"{self.name} has no attribute(s) {sorted(unknown)}; "
                             f"it takes {sorted(self.attrs)}")
        full = {}
        for name, default in self.attrs.items():
            if name in attrs:
                full[name] = attrs[name]
            elif default is REQUIRED:
                raise ShapeError(f"{self.name} needs attribute {name}")
            else:
                full[name] = default
        full.update((name, attrs[name]) for name in META_ATTRS if name in attrs)
        return full


def _without_meta(reference: Callable[..., Any], meta: tuple[str, ...]) -> Callable[..., Any]:
    """`reference` called with node attributes minus the provenance-only `meta` ones."""
    if getattr(reference, "drops_meta", False) or not meta:
        return reference

    def run(*args, **attrs):
        for name in meta:
            attrs.pop(name, None)
        return reference(*args, **attrs)
    run.drops_meta = True
    run.__doc__ = reference.__doc__
    return run


OPS: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in OPS:
        raise ValueError(f"op {opdef.name} registered twice")
    OPS[opdef.name] = opdef
    return opdef


def define(name: str, inputs: str, infer, reference, kind: str, summary: str,
           commutative: bool = False, **attrs) -> OpDef:
    """Shorthand used by the op tables: `inputs` is a space-separated signature."""
    return register(OpDef(name, tuple(inputs.split()), attrs, infer, reference, kind, summary,
                          commutative))


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise ShapeError(f"unknown op '{name}'") from None
