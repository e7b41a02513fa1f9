"""Element types of IR values.

The IR names dtypes itself (`f32`, `bf16`, `i64`, ...) so that the IR, the text form and the runtime
do not depend on torch; conversions to torch and numpy dtypes are looked up lazily by name.
"""

from __future__ import annotations

import enum
import functools


class DType(enum.Enum):
    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    f8e4m3 = "f8e4m3"
    f8e5m2 = "f8e5m2"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u8 = "u8"
    bool = "bool"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"DType.{self.value}"

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    def to_torch(self):
        import torch

        return getattr(torch, _TORCH_NAMES[self])

    def to_numpy(self):
        """numpy dtype; bf16 and fp8 have none in numpy, so they map to `ml_dtypes` if present."""
        import numpy as np

        if self in _NUMPY_NAMES:
            return np.dtype(_NUMPY_NAMES[self])
        try:
            import ml_dtypes
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise TypeError(f"numpy has no {self} dtype; install ml_dtypes") from exc
        return np.dtype(getattr(ml_dtypes, _ML_DTYPES_NAMES[self]))

    @classmethod
    def from_torch(cls, dtype) -> DType:
        name = str(dtype).removeprefix("torch.")
        for ours, theirs in _TORCH_NAMES.items():
            if theirs == name:
                return ours
        raise TypeError(f"dtype {dtype} has no IR equivalent")

    @classmethod
    def from_numpy(cls, dtype) -> DType:
        import numpy as np

        return _from_numpy_dtype(np.dtype(dtype))


@functools.cache
def _from_numpy_dtype(dtype) -> DType:
    """Memoised: the runtime checks every input's dtype on every call."""
    name = dtype.name
    for ours, theirs in (*_NUMPY_NAMES.items(), *_ML_DTYPES_NAMES.items()):
        if theirs == name:
            return ours
    raise TypeError(f"numpy dtype {name} has no IR equivalent")


_FLOATS = {DType.f64, DType.f32, DType.f16, DType.bf16, DType.f8e4m3, DType.f8e5m2}
_ITEMSIZE = {
    DType.f64: 8, DType.f32: 4, DType.f16: 2, DType.bf16: 2, DType.f8e4m3: 1, DType.f8e5m2: 1,
    DType.i64: 8, DType.i32: 4, DType.i16: 2, DType.i8: 1, DType.u8: 1, DType.bool: 1,
}
_TORCH_NAMES = {
    DType.f64: "float64", DType.f32: "float32", DType.f16: "float16", DType.bf16: "bfloat16",
    DType.f8e4m3: "float8_e4m3fn", DType.f8e5m2: "float8_e5m2", DType.i64: "int64",
    DType.i32: "int32", DType.i16: "int16", DType.i8: "int8", DType.u8: "uint8", DType.bool: "bool",
}
_NUMPY_NAMES = {
    DType.f64: "float64", DType.f32: "float32", DType.f16: "float16", DType.i64: "int64",
    DType.i32: "int32", DType.i16: "int16", DType.i8: "int8", DType.u8: "uint8", DType.bool: "bool",
}
_ML_DTYPES_NAMES = {
    DType.bf16: "bfloat16", DType.f8e4m3: "float8_e4m3fn", DType.f8e5m2: "float8_e5m2",
}

DTYPE_NAMES = frozenset(d.value for d in DType)
