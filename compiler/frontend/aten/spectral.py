"""Discrete Fourier transforms (torch.fft, as exported: `_fft_c2c`, `_fft_r2c`, `_fft_c2r`) as
matmuls with DFT matrices, on complex values in the IR's (real, imaginary) layout.

An n-point DFT along one dim is a matmul with an n x n matrix of cos/sin, so the transform needs
no new IR op: every backend runs it as a GEMM (the TPU form FNet's authors use too), fusion and
quantization passes leave it alone, and a transform over several dims is one per dim. The matrix
is built in the graph from `arange` (k*n reduced mod n in integers, so the angle is exact before
it is scaled): folded to a constant for a static size, computed per call for a symbolic one.
It costs O(n^2) per dim where an FFT costs O(n log n), which is what FNet's sizes can afford;
sums come in another order than pocketfft's, so results agree to rounding, not bitwise.

A transform of dim d works on the complex value laid out as [..., 2, n] (parts before the dim)
flattened to [..., 2n], times the real 2n x 2n matrix [[C, sS], [-sS, C]] (s = -1 forward, +1
inverse), which gives [..., 2n] = [real parts, imaginary parts] of the result.
"""

from __future__ import annotations

import math

from compiler.ir import DType, Value
from compiler.ir.symbolic import Dim

from ..emitter import AtenEmitter, Unsupported
from .complex_numbers import complex_converts, to_complex, unwrap

# torch's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n
_BY_ROOT_N, _BY_N = 1, 2


def _size(em: AtenEmitter, n: Dim, dtype: DType) -> Value:
    return em.cast(em.const(n, DType.i64), dtype)


def _angles(em: AtenEmitter, rows: Dim, cols: Dim, n: Dim, dtype: DType) -> Value:
    """2*pi*(k*j mod n)/n for k < rows, j < cols: the exact phase of every matrix entry."""
    k = em.op("reshape", em.op("arange", start=0, end=rows, step=1), shape=[rows, 1])
    j = em.op("reshape", em.op("arange", start=0, end=cols, step=1), shape=[1, cols])
    phase = em.op("remainder", em.op("mul", k, j), em.const(n, DType.i64))
    unit = em.op("div", em.const(2 * math.pi, dtype), _size(em, n, dtype))
    return em.op("mul", em.cast(phase, dtype), unit)


def _scale(em: AtenEmitter, n: Dim, normalization: int, dtype: DType) -> Value | None:
    if normalization == _BY_N:
        return em.op("reciprocal", _size(em, n, dtype))
    if normalization == _BY_ROOT_N:
        return em.op("rsqrt", _size(em, n, dtype))
    return None


def _scaled(em: AtenEmitter, x: Value, scale: Value | None) -> Value:
    return x if scale is None else em.op("mul", x, scale)


def _parts_last(em: AtenEmitter, z: Value, dim: int) -> tuple[Value, list[int]]:
    """z [..., d, ..., 2] as [..., 2 * size(d)] (real parts, then imaginary), and the
    permutation that put the parts and d last."""
    rank = z.type.rank - 1
    order = [i for i in range(rank) if i != dim] + [rank, dim]
    moved = em.op("permute", z, dims=order)
    flat = [*moved.shape[:-2], 2 * z.shape[dim]]
    return em.op("reshape", moved, shape=flat), order


def _restore(em: AtenEmitter, y: Value, order: list[int], lead: list[Dim], n: Dim) -> Value:
    y = em.op("reshape", y, shape=[*lead, 2, n])
    inverse = [order.index(i) for i in range(len(order))]
    return em.op("permute", y, dims=inverse)


def _dft(em: AtenEmitter, z: Value, dim: int, forward: bool, normalization: int) -> Value:
    """The complex DFT of `z` along complex dim `dim`."""
    dtype, n = z.dtype, z.shape[dim]
    flat, order = _parts_last(em, z, dim)
    angle = _angles(em, n, n, n, dtype)
    scale = _scale(em, n, normalization, dtype)
    cos, sin = _scaled(em, em.op("cos", angle), scale), _scaled(em, em.op("sin", angle), scale)
    signed = em.op("neg", sin) if forward else sin
    top = em.op("concat", cos, signed, dim=1)
    bottom = em.op("concat", em.op("neg", signed), cos, dim=1)
    matrix = em.op("concat", top, bottom, dim=0)
    y = em.op("matmul", flat, matrix)
    return _restore(em, y, order, list(flat.shape[:-1]), n)


def _dims(z: Value, dims) -> list[int]:
    rank = max(z.type.rank - 1, 1)
    return [d % rank for d in dims]


@complex_converts("_fft_c2c.default", ir="arange, cos, sin, matmul", only_complex=True)
def _fft_c2c(em: AtenEmitter, a):
    z = em.cast(unwrap(a["self"]), em.out_dtype())
    for dim in _dims(z, a["dim"]):
        z = _dft(em, z, dim, bool(a["forward"]), a["normalization"])
    return z


@complex_converts("_fft_r2c.default", ir="arange, cos, sin, matmul, slice", only_complex=True)
def _fft_r2c(em: AtenEmitter, a):
    """The full complex transform of the real input; `onesided` keeps the n//2 + 1 outputs of
    the last transformed dim that the others mirror."""
    dtype = em.out_dtype()
    z = to_complex(em, a["self"], dtype)
    dims = _dims(z, a["dim"])
    for dim in dims:
        z = _dft(em, z, dim, True, a["normalization"])
    if a["onesided"]:
        last = dims[-1]
        z = em.op("slice", z, dim=last, start=0, end=em.out_shape()[last], step=1)
    return z


@complex_converts("_fft_c2r.default", ir="arange, cos, sin, matmul", only_complex=True)
def _fft_c2r(em: AtenEmitter, a):
    """Inverse complex transforms of all dims but the last, then the real inverse of the last
    from its n//2 + 1 coefficients: x_j = sum_k w_k (Re X_k cos - Im X_k sin)(2 pi k j / n),
    w_k = 2 for the coefficients that stand for a mirrored pair, 1 for k = 0 and k = n/2."""
    z = em.cast(unwrap(a["self"]), em.out_dtype())
    dims = _dims(z, a["dim"])
    for dim in dims[:-1]:
        z = _dft(em, z, dim, False, a["normalization"])
    last, n = dims[-1], a["last_dim_size"]
    half = z.shape[last]
    if not isinstance(n, int) or not isinstance(half, int) or half != n // 2 + 1:
        raise Unsupported("irfft with an input length other than n // 2 + 1 for its n")
    dtype = z.dtype
    flat, order = _parts_last(em, z, last)
    angle = _angles(em, half, n, n, dtype)
    k = em.op("arange", start=0, end=half, step=1)
    single = em.op("logical_or", em.op("eq", k, em.const(0, DType.i64)),
                   em.op("eq", em.op("mul", k, em.const(2, DType.i64)), em.const(n, DType.i64)))
    weight = em.op("where", single, em.const(1.0, dtype), em.const(2.0, dtype))
    weight = em.op("reshape", weight, shape=[half, 1])
    scale = _scale(em, n, a["normalization"], dtype)
    cos = _scaled(em, em.op("mul", weight, em.op("cos", angle)), scale)
    sin = _scaled(em, em.op("mul", weight, em.op("sin", angle)), scale)
    matrix = em.op("concat", cos, em.op("neg", sin), dim=0)  # [2 * half, n]
    y = em.op("matmul", flat, matrix)
    kept = order[:-2] + [last]  # y's dims, as the input's
    return em.op("permute", y, dims=[kept.index(d) for d in range(len(kept))])
