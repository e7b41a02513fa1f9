"""Input validation: every input is checked against its spec before a backend sees it.

Backends get inputs they can trust (count, dtype, rank, static sizes, symbol ranges, symbols that
agree across inputs); the user gets an error naming the input, the dim and what was expected,
instead of a shape error from deep inside a kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.errors import InputError
from compiler.ir import DType

from .dims import dim_symbols, eval_dim
from .specs import TensorSpec


def validate_inputs(specs: Sequence[TensorSpec], arrays: Sequence[np.ndarray]) -> dict[str, int]:
    """Raise InputError at the first input that breaks its spec; returns the symbol values."""
    if len(arrays) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise InputError(f"the model takes {len(specs)} input(s) ({names}), got {len(arrays)}",
                         "model inputs", f"pass exactly: {'; '.join(str(s) for s in specs)}")
    bound: dict[str, tuple[int, str]] = {}  # symbol -> (value, which dim set it)
    for spec, array in zip(specs, arrays):
        _check_dtype(spec, array)
        _check_rank(spec, array)
        for axis, (dim, size) in enumerate(zip(spec.shape, array.shape)):
            _check_dim(spec, axis, dim, int(size), bound)
    values = {name: value for name, (value, _) in bound.items()}
    for spec, array in zip(specs, arrays):
        for axis, (dim, size) in enumerate(zip(spec.shape, array.shape)):
            if isinstance(dim, str) and dim not in spec.ranges:
                _check_expression(spec, axis, dim, int(size), values)
    return values


def _check_dtype(spec: TensorSpec, array: np.ndarray) -> None:
    try:
        got = DType.from_numpy(array.dtype).value
    except TypeError:
        got = str(array.dtype)
    if got != spec.dtype:
        raise InputError(f"input '{spec.name}' has dtype {got} but the model expects {spec.dtype}",
                         f"input '{spec.name}'",
                         f"convert it, e.g. x.astype({_numpy_name(spec.dtype)})")


def _check_rank(spec: TensorSpec, array: np.ndarray) -> None:
    if array.ndim != len(spec.shape):
        raise InputError(f"input '{spec.name}' has rank {array.ndim} (shape {list(array.shape)}) "
                         f"but the model expects rank {len(spec.shape)}: {spec.type_str()}",
                         f"input '{spec.name}'", f"pass a tensor of shape {spec.type_str()}")


def _check_dim(spec: TensorSpec, axis: int, dim, size: int,
               bound: dict[str, tuple[int, str]]) -> None:
    where = f"input '{spec.name}' dim {axis}"
    if isinstance(dim, int):
        if size != dim:
            raise InputError(f"{where} is {size} but must be {dim}", where,
                             f"pass a tensor of shape {spec.type_str()}")
        return
    if dim not in spec.ranges:  # an expression; checked once every symbol is bound
        return
    if dim in bound:
        value, origin = bound[dim]
        if size != value:
            raise InputError(f"{where} is {size} but {dim} is {value} (from {origin})", where,
                             f"every dim named {dim} must have the same size")
        return
    lo, hi = spec.ranges[dim]
    if size < lo or (hi is not None and size > hi):
        allowed = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise InputError(f"{where} is {size} but {dim} must be {allowed}", where,
                         f"the model was compiled for {dim} {allowed}; recompile with a wider "
                         "range to go beyond it")
    bound[dim] = (size, where)


def _check_expression(spec: TensorSpec, axis: int, dim: str, size: int,
                      values: dict[str, int]) -> None:
    if not dim_symbols(dim) <= set(values):
        return  # a symbol no input binds directly: nothing to compare against
    expected = eval_dim(dim, values)
    if size != expected:
        where = f"input '{spec.name}' dim {axis}"
        given = ", ".join(f"{s} = {values[s]}" for s in sorted(dim_symbols(dim)))
        raise InputError(f"{where} is {size} but {dim} = {expected} ({given})", where,
                         f"pass a tensor of shape {spec.type_str()}")


def _numpy_name(dtype: str) -> str:
    try:
        name = DType(dtype).to_numpy().name
    except TypeError:
        return dtype
    return f"np.{name}" if hasattr(np, name) else f"ml_dtypes.{name}"
