"""What the running ONNX Runtime can execute: its registered CPU kernels, as data.

Fused lowerings (see `fused`) name the kernels they need; the lowering asks a `KernelSet` before
choosing one. The set is read from ORT's kernel registry, which lists exactly the kernels compiled
into this build: a minimal or reduced build simply lacks the contrib entries, and the lowering then
falls back to standard ONNX ops instead of producing a model the build cannot load.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class OrtKernel:
    """One kernel requirement: op `op_type` in `domain` ("" is ONNX) for element type `dtype`."""

    domain: str
    op_type: str
    dtype: str = "float"

    def __str__(self) -> str:
        return f"{self.domain}.{self.op_type}" if self.domain else self.op_type


class KernelSet:
    """Kernels available for lowering; `without` simulates a build that lacks some of them."""

    def __init__(self, kernels: Iterable[tuple[str, str, str]],
                 excluded: Iterable[str] = ()):
        self._kernels = frozenset(kernels)
        self.excluded = frozenset(excluded)  # names left out on request (`exclude_kernels`)

    def has(self, kernel: OrtKernel) -> bool:
        return (kernel.domain, kernel.op_type, kernel.dtype) in self._kernels

    def has_op(self, name: str) -> bool:
        """Whether any kernel is registered for "domain.op" (or a plain ONNX op name)."""
        domain, _, op_type = name.rpartition(".")
        return any(k[0] == domain and k[1] == op_type for k in self._kernels)

    def without(self, names: Iterable[str]) -> KernelSet:
        """This set minus every kernel whose "domain.op" (or plain op) name is in `names`."""
        names = set(names)
        return KernelSet((k for k in self._kernels
                          if (f"{k[0]}.{k[1]}" if k[0] else k[1]) not in names),
                         self.excluded | names)

    def __len__(self) -> int:
        return len(self._kernels)


@functools.lru_cache(maxsize=1)
def installed_kernels() -> KernelSet:
    """The CPU kernels of the installed onnxruntime (empty when the build cannot list them),
    plus dayzero's own (`native_ops`) when their library is built and loads."""
    from .native_ops import kernels as native_kernels

    try:
        from .ort_module import ort

        defs = ort.capi._pybind_state.get_all_opkernel_def()
    except (ImportError, AttributeError):  # pragma: no cover - minimal builds
        return KernelSet(())
    entries = set()
    for d in defs:
        if d.provider != "CPUExecutionProvider":
            continue
        for types in d.type_constraints.values():
            for t in types:
                entries.add((d.domain, d.op_name, t.removeprefix("tensor(").removesuffix(")")))
    return KernelSet(entries | set(native_kernels()))
