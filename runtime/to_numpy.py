"""numpy arrays from torch tensors, without importing torch.

The runtime must run where torch is not installed, so a tensor is recognised by its type's module
and converted with its own methods; the dtypes numpy lacks (bf16, fp8) are moved as raw bits and
viewed as their `ml_dtypes` equivalents.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from compiler.ir.dtypes import DType

# dtypes numpy cannot take from torch directly -> torch integer dtype of the same width
_RAW_BITS = {DType.bf16: "int16", DType.f8e4m3: "uint8", DType.f8e5m2: "uint8"}


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def to_numpy(x: Any) -> np.ndarray:
    """`x` as a numpy array (no copy when it is already one or a CPU tensor numpy can share)."""
    if type(x) is np.ndarray:  # the common case, on every step of a generation loop
        return x
    if not is_torch_tensor(x):
        return np.asarray(x)
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    dtype = DType.from_torch(t.dtype)
    if dtype in _RAW_BITS:
        torch = sys.modules["torch"]  # imported, since `x` is a tensor
        bits = t.contiguous().view(getattr(torch, _RAW_BITS[dtype])).numpy()
        return bits.view(dtype.to_numpy())
    return t.numpy()
