"""Input validation: every input is checked against its spec before a backend sees it.

Backends get inputs they can trust (count, dtype, rank, static sizes, symbol ranges, symbols that
agree across inputs, native byte order, indices inside the tables they index); the user gets an
error naming the input, the dim or value and what was expected, instead of a shape error from
deep inside a kernel or a silently wrong result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.errors import InputError
from compiler.ir.dtypes import DType

from .dims import dim_symbols, eval_dim
from .index_inputs import IndexRange
from .specs import TensorSpec
from .to_numpy import to_numpy


def prepare_inputs(specs: Sequence[TensorSpec], inputs: Sequence[Any],
                   index_ranges: Mapping[str, IndexRange] | None = None,
                   known: Mapping[str, int] | None = None
                   ) -> tuple[list[np.ndarray], dict[str, int]]:
    """The inputs (numpy arrays or torch tensors) as C-ordered native-byte-order numpy arrays,
    validated; returns them and the symbol values (`known`: those other inputs, validated
    earlier, already bound)."""
    # not np.ascontiguousarray: it turns a 0-d input into shape [1]
    arrays = [native_byte_order(np.asarray(to_numpy(x), order="C")) for x in inputs]
    return arrays, validate_inputs(specs, arrays, index_ranges, known)


def native_byte_order(array: np.ndarray) -> np.ndarray:
    """`array` in this machine's byte order: backends read the raw bytes (ONNX Runtime gave
    silently wrong results for a big-endian float32 input); a copy only when it is not."""
    if array.dtype.isnative:
        return array
    return array.astype(array.dtype.newbyteorder("="), order="C")


def validate_inputs(specs: Sequence[TensorSpec], arrays: Sequence[np.ndarray],
                    index_ranges: Mapping[str, IndexRange] | None = None,
                    known: Mapping[str, int] | None = None) -> dict[str, int]:
    """Raise InputError at the first input that breaks its spec; returns the symbol values.

    `index_ranges` gives the inputs that index a weight table the values they may hold;
    `known` the symbol values of inputs validated before (`CompiledModel.with_fixed_inputs`)."""
    if len(arrays) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise InputError(f"the model takes {len(specs)} input(s) ({names}), got {len(arrays)}",
                         "model inputs", f"pass exactly: {'; '.join(str(s) for s in specs)}")
    # symbol -> (value, which dim set it)
    bound: dict[str, tuple[int, str]] = {name: (value, "the fixed inputs")
                                         for name, value in (known or {}).items()}
    for spec, array in zip(specs, arrays):
        _check_dtype(spec, array)
        _check_rank(spec, array)
        for axis, (dim, size) in enumerate(zip(spec.shape, array.shape)):
            _check_dim(spec, axis, dim, int(size), bound)
    values = {name: value for name, (value, _) in bound.items()}
    for spec, array in zip(specs, arrays):
        for axis, (dim, size) in enumerate(zip(spec.shape, array.shape)):
            if isinstance(dim, str) and dim not in spec.ranges:
                _bind_affine(spec, axis, dim, int(size), values)
                _check_expression(spec, axis, dim, int(size), values)
    for spec, array in zip(specs, arrays):
        if index_ranges and spec.name in index_ranges:
            _check_indices(index_ranges[spec.name], array)
    return values


def _check_dtype(spec: TensorSpec, array: np.ndarray) -> None:
    got = _ir_dtype_names.get(array.dtype)
    if got is None:
        try:
            got = DType.from_numpy(array.dtype).value
        except TypeError:
            got = str(array.dtype)
        _ir_dtype_names[array.dtype] = got
    if got != spec.dtype:
        raise InputError(f"input '{spec.name}' has dtype {got} but the model expects {spec.dtype}",
                         f"input '{spec.name}'",
                         f"convert it, e.g. x.astype({_numpy_name(spec.dtype)})")


_ir_dtype_names: dict[np.dtype, str] = {}  # numpy dtype -> IR dtype name (memo: per step)


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


def _bind_affine(spec: TensorSpec, axis: int, dim: str, size: int,
                 values: dict[str, int]) -> None:
    """Bind the one symbol of an affine dim no input has bare (`2*s0`: torch.export's derived
    Dim `seq = 2*_seq`): s0 = (size - c) / a must be a whole number in the symbol's range."""
    free = dim_symbols(dim) - set(values)
    if len(free) != 1 or not dim_symbols(dim) - free <= set(values):
        return
    sym = next(iter(free))
    at = [eval_dim(dim, {**values, sym: k}) for k in (0, 1, 2)]
    a, c = at[1] - at[0], at[0]
    if a <= 0 or at[2] != 2 * a + c:
        return  # not affine in the symbol: nothing to solve
    lo, hi = spec.ranges.get(sym, (0, None))
    value, rest = divmod(size - c, a)
    if rest or value < lo or (hi is not None and value > hi):
        where = f"input '{spec.name}' dim {axis}"
        allowed = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise InputError(f"{where} is {size} but must be {dim} for a whole {sym} {allowed}",
                         where, f"pass a size {dim} with {sym} {allowed} (the model was "
                         f"compiled for that relation)")
    values[sym] = value


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


def _check_indices(valid: IndexRange, array: np.ndarray) -> None:
    if array.size == 0:
        return
    lo, hi = int(array.min()), int(array.max())
    if valid.lo <= lo and hi < valid.hi:
        return
    bad = (array < valid.lo) | (array >= valid.hi)
    position = tuple(int(i) for i in np.argwhere(bad)[0])
    value = int(array[position])
    where = f"input '{valid.input}' at position {list(position)}"
    raise InputError(f"input '{valid.input}' holds {value} at position {list(position)}, "
                     f"outside the valid range [{valid.lo}, {valid.hi - 1}] of the weight table "
                     f"'{valid.table}' it indexes ({valid.op})", where,
                     f"pass values in [{valid.lo}, {valid.hi - 1}] (for token ids: use the "
                     "tokenizer the model was compiled with)")


def _numpy_name(dtype: str) -> str:
    try:
        name = DType(dtype).to_numpy().name
    except TypeError:
        return dtype
    return f"np.{name}" if hasattr(np, name) else f"ml_dtypes.{name}"


class OutputShapeError(RuntimeError):
    """A backend returned an output whose shape is not its IR type at these input sizes: a
    lowering bug (never the user's input, nor an edited manifest: its output specs are checked
    against graph.dzir at load, `runtime.consistency`), raised rather than returned as a wrong
    result."""


def check_output_shapes(specs: Sequence[TensorSpec], outputs: Sequence[np.ndarray],
                        values: Mapping[str, int], producer: str) -> None:
    """Every output's shape against its spec, with the symbols bound by the inputs. Cheap
    (a few integer evaluations per call) and always on: a lowering that returned a (1, 0, 4)
    tensor for f32[1, s0, 4] once went unnoticed."""
    known: dict[tuple, tuple] = {}  # spec shape -> expected: a step's K/V outputs share one
    for spec, out in zip(specs, outputs):
        expected = known.get(spec.shape)
        if expected is None:
            expected = known[spec.shape] = tuple(_expected_shape(spec, values))
        if expected == getattr(out, "shape", None):  # the common case: every dim known, equal
            continue
        got = tuple(int(d) for d in np.shape(out))
        if len(got) != len(spec.shape) or any(
                e is not None and e != g for e, g in zip(expected, got)):
            shown = ", ".join("?" if e is None else str(e) for e in expected)
            given = ", ".join(f"{k} = {v}" for k, v in sorted(values.items()))
            raise OutputShapeError(
                f"{producer} returned output '{spec.name}' of shape {list(got)}, but its type "
                f"{spec.type_str()} is [{shown}] for these inputs ({given or 'no symbols'}): "
                "a lowering bug; please report it with the artifact (the reference backend is "
                "the golden model: recompile with --backend reference to compare)")


def _expected_shape(spec: TensorSpec, values: Mapping[str, int]) -> list[int | None]:
    """The spec's dims at these symbol values; None for a dim whose symbols no input binds."""
    shape: list[int | None] = []
    for dim in spec.shape:
        if isinstance(dim, int):
            shape.append(dim)
        elif dim in values:
            shape.append(values[dim])
        elif dim_symbols(dim) <= set(values):
            shape.append(eval_dim(dim, values))
        else:
            shape.append(None)
    return shape
