"""Tensor types: a dtype and a shape of (possibly symbolic) dims."""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DType
from .symbolic import Dim, dim_str, normalize


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(normalize(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(dim_str(d) for d in self.shape)}]"

    def with_shape(self, shape) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)
