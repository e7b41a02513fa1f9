"""Complex tensors, in the IR as real ones: a trailing dim of 2 holding (real, imaginary).

The IR has no complex dtype and needs none: a complex64 tensor of shape S is an f32 value of shape
S + [2] (complex128: f64), exactly torch.view_as_real's layout. So `view_as_complex` and
`view_as_real` convert to nothing, every backend runs the arithmetic as plain real ops, and the
fusion passes see ordinary muls and adds. A complex graph output is returned in that layout too.

Converters here see a node whose operands or results are complex (DeepSeek-V2's rotary:
`polar`, `view_as_complex`, a complex multiply, `view_as_real`; FNet's FFT and `.real`). The
walker sends such nodes to `COMPLEX` instead of the ordinary table, with each complex operand
wrapped in `Complex` (an IR value does not say whether its trailing 2 is a complex pair), and with
torch's computed result shown as its real view, so `em.out_shape()` includes the trailing 2.
A node on complex tensors whose op is not in `COMPLEX` is reported as unsupported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from compiler.ir import Value

from ..emitter import AtenEmitter, Unsupported
from . import shape as shape_ops
from .table import Converter, converts


class Complex(NamedTuple):
    """A complex operand: `value` is its real view, shape [..., 2]."""
    value: Value


COMPLEX: dict[str, Converter] = {}


def complex_converts(*names: str, ir: str = "", only_complex: bool = False
                     ) -> Callable[[Converter], Converter]:
    """Register for nodes on complex tensors; `only_complex` ops (polar, view_as_real, the
    FFTs) also enter the ordinary table, so that torch keeps them whole and docs/ops.md lists
    them."""
    def register(fn: Converter) -> Converter:
        for name in names:
            COMPLEX[f"aten.{name}"] = fn
        if only_complex:
            converts(*names, ir=ir)(fn)
        return fn
    return register


def is_complex(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and val.is_complex()


_PART_DTYPES = {torch.complex32: torch.float16, torch.complex64: torch.float32,
                torch.complex128: torch.float64}


def real_view(val: Any) -> Any:
    """torch's result as the IR holds it: a complex tensor as a real one with a trailing 2 (a
    stand-in of that type: view_as_real itself refuses conjugated results)."""
    if isinstance(val, (tuple, list)):
        return type(val)(real_view(v) for v in val)
    if not is_complex(val):
        return val
    return val.new_empty((*val.shape, 2), dtype=_PART_DTYPES[val.dtype])


def unwrap(x: Any) -> Any:
    if isinstance(x, Complex):
        return x.value
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: unwrap(v) for k, v in x.items()}
    return x


# -- building blocks -----------------------------------------------------------------------------
def parts(em: AtenEmitter, z: Value) -> tuple[Value, Value]:
    """(real, imaginary) of a complex value."""
    last = z.type.rank - 1
    return em.op("select", z, dim=last, index=0), em.op("select", z, dim=last, index=1)


def join(em: AtenEmitter, re: Value, im: Value) -> Value:
    """The complex value with these parts (of one shape)."""
    pair = [em.op("reshape", p, shape=[*p.shape, 1]) for p in (re, im)]
    return em.op("concat", *pair, dim=re.type.rank)


def to_complex(em: AtenEmitter, x: Value, dtype) -> Value:
    """A real tensor as a complex one with imaginary part 0."""
    x = em.cast(x, dtype)
    return join(em, x, em.op("full", shape=list(x.shape), value=0.0, dtype=dtype))


def operand(em: AtenEmitter, x: Any, dtype) -> Value:
    """Any operand of a complex op, as a complex value."""
    if isinstance(x, Complex):
        return em.cast(x.value, dtype)
    if isinstance(x, Value):
        return to_complex(em, x, dtype)
    if isinstance(x, complex):
        return join(em, em.const(x.real, dtype), em.const(x.imag, dtype))
    return join(em, em.const(x, dtype), em.const(0.0, dtype))


# -- the complex-only ops ------------------------------------------------------------------------
@complex_converts("view_as_complex.default", "view_as_real.default", ir="(identity)",
                  only_complex=True)
def _view(em: AtenEmitter, a):
    return unwrap(a["self"])


@complex_converts("polar.default", ir="cos, sin, mul, concat", only_complex=True)
def _polar(em: AtenEmitter, a):
    dtype = em.out_dtype()
    magnitude, angle = em.cast(a["abs"], dtype), em.cast(a["angle"], dtype)
    return join(em, em.op("mul", magnitude, em.op("cos", angle)),
                em.op("mul", magnitude, em.op("sin", angle)))


@complex_converts("complex.default", ir="concat", only_complex=True)
def _complex(em: AtenEmitter, a):
    dtype = em.out_dtype()
    shape = em.out_shape()[:-1]
    re, im = (em.op("expand", em.cast(a[k], dtype), shape=shape) for k in ("real", "imag"))
    return join(em, re, im)


@complex_converts("real.default", ir="select")
def _real(em: AtenEmitter, a):
    return parts(em, unwrap(a["self"]))[0]


@complex_converts("imag.default", ir="select")
def _imag(em: AtenEmitter, a):
    return parts(em, unwrap(a["self"]))[1]


@complex_converts("abs.default", ir="mul, add, sqrt")
def _abs(em: AtenEmitter, a):
    re, im = parts(em, unwrap(a["self"]))
    return em.op("sqrt", em.op("add", em.op("mul", re, re), em.op("mul", im, im)))


@complex_converts("_conj.default", "conj_physical.default", "_conj_physical.default",
                  "conj.default", ir="neg, concat")
def _conj(em: AtenEmitter, a):
    re, im = parts(em, unwrap(a["self"]))
    return join(em, re, em.op("neg", im))


# -- arithmetic ----------------------------------------------------------------------------------
@complex_converts("mul.Tensor", "mul.Scalar")
def _mul(em: AtenEmitter, a):
    dtype = em.out_dtype()
    x, y = a["self"], a["other"]
    if not isinstance(x, Complex):
        x, y = y, x
    if isinstance(y, Complex):  # (a + bi)(c + di) = (ac - bd) + (ad + bc)i
        (ar, ai), (br, bi) = parts(em, em.cast(x.value, dtype)), parts(em, em.cast(y.value, dtype))
        re = em.op("sub", em.op("mul", ar, br), em.op("mul", ai, bi))
        im = em.op("add", em.op("mul", ar, bi), em.op("mul", ai, br))
        return join(em, re, im)
    if isinstance(y, Value):  # a real tensor scales both parts
        return em.op("mul", em.cast(x.value, dtype),
                     em.op("reshape", em.cast(y, dtype), shape=[*y.shape, 1]))
    if isinstance(y, complex):
        return _mul(em, {"self": x, "other": Complex(operand(em, y, dtype))})
    return em.op("mul", em.cast(x.value, dtype), em.const(y, dtype))


def _add_sub(target: str):
    def convert(em: AtenEmitter, a):
        dtype = em.out_dtype()
        x, y = operand(em, a["self"], dtype), operand(em, a["other"], dtype)
        alpha = a.get("alpha", 1)
        if alpha != 1:
            y = _mul(em, {"self": Complex(y), "other": alpha})
        return em.op(target, x, y)
    return convert


complex_converts("add.Tensor", "add.Scalar")(_add_sub("add"))
complex_converts("sub.Tensor", "sub.Scalar")(_add_sub("sub"))


@complex_converts("div.Tensor", "div.Scalar")
def _div(em: AtenEmitter, a):
    """By a real divisor only: torch divides by a complex one with Smith's scaled algorithm,
    which a plain formula would not match to the last bit."""
    x, y = a["self"], a["other"]
    if isinstance(y, Complex) or isinstance(y, complex) or not isinstance(x, Complex):
        raise Unsupported("division by a complex number")
    dtype = em.out_dtype()
    y = em.op("reshape", em.cast(y, dtype), shape=[*y.shape, 1]) if isinstance(y, Value) \
        else em.const(y, dtype)
    return em.op("div", em.cast(x.value, dtype), y)


@complex_converts("neg.default")
def _neg(em: AtenEmitter, a):
    return em.op("neg", unwrap(a["self"]))


@complex_converts("_to_copy.default", "to.dtype", "to.dtype_layout", "to.device")
def _to(em: AtenEmitter, a):
    """real -> complex gets a zero imaginary part; complex -> real keeps the real part (torch
    warns that it discards the imaginary one)."""
    x, dtype = a["self"], em.out_dtype()
    if not isinstance(x, Complex):
        return to_complex(em, x, dtype)
    if len(em.out_shape()) == x.value.type.rank:  # complex to complex
        return em.cast(x.value, dtype)
    return em.cast(parts(em, x.value)[0], dtype)


# -- views and data movement: the ordinary converters, dims counted without the trailing 2 -------
def _same(fn: Converter) -> Converter:
    def convert(em: AtenEmitter, a):
        return fn(em, unwrap(a))
    return convert


for _names, _fn in [(("alias.default", "clone.default", "contiguous.default", "detach.default"),
                     shape_ops._identity),
                    (("view.default", "_unsafe_view.default", "reshape.default",
                      "unsqueeze.default", "squeeze.dim", "squeeze.dims", "squeeze.default",
                      "flatten.using_ints"), shape_ops._reshape),
                    (("expand.default",), shape_ops._expand),
                    (("_assert_tensor_metadata.default",), shape_ops._dropped)]:
    complex_converts(*_names)(_same(_fn))


def _rank(a) -> int:
    """The complex operand's rank (its real view's, less the trailing 2)."""
    x = a["self"] if "self" in a else a["tensors"][0]
    return unwrap(x).type.rank - 1


def _dims_normalized(fn: Converter, *keys: str) -> Converter:
    def convert(em: AtenEmitter, a):
        rank = max(_rank(a), 1)
        a = unwrap(a)
        for key in keys:
            a[key] = [d % rank for d in a[key]] if isinstance(a[key], (list, tuple)) \
                else a[key] % rank
        return fn(em, a)
    return convert


complex_converts("transpose.int")(_dims_normalized(shape_ops._transpose, "dim0", "dim1"))
complex_converts("select.int")(_dims_normalized(shape_ops._select, "dim"))
complex_converts("slice.Tensor")(_dims_normalized(shape_ops._slice_tensor, "dim"))


@complex_converts("cat.default")
def _cat(em: AtenEmitter, a):
    dtype = em.out_dtype()
    tensors = [operand(em, t, dtype) for t in a["tensors"]]
    rank = max(tensors[0].type.rank - 1, 1)
    return em.op("concat", *tensors, dim=a["dim"] % rank)


@complex_converts("constant_pad_nd.default")
def _pad(em: AtenEmitter, a):
    """Pads count from the last dim, so the trailing 2 gets a (0, 0) pair first."""
    value = a["value"]
    if isinstance(value, complex) and value.imag != 0:
        raise Unsupported("padding with a complex value")
    x = unwrap(a["self"])
    return em.op("pad", x, pads=[0, 0, *a["pad"]], value=float(getattr(value, "real", value)))


@complex_converts("permute.default")
def _permute(em: AtenEmitter, a):
    x = unwrap(a["self"])
    rank = x.type.rank - 1
    return em.op("permute", x, dims=[d % max(rank, 1) for d in a["dims"]] + [rank])
