"""Elementwise ATen ops: unary math, activations, clamps, binary arithmetic, comparisons, where.

Operands are cast to the dtype torch computes in (the node's result dtype for arithmetic, the
promoted operand dtype for comparisons), so the IR sees one dtype per op; Python scalars become
0-d constants of that dtype.
"""

from __future__ import annotations

from compiler.ir import DType

from ..emitter import AtenEmitter, Unsupported
from .table import converts, register_many

_UNARY = [
    "neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "sigmoid", "relu", "erf", "erfinv", "reciprocal", "floor", "ceil", "trunc", "sign",
    "bitwise_not", "frac", "silu", "hardsigmoid", "hardswish",
]
_BOOL_UNARY = ["isnan", "isinf", "logical_not"]


def _unary(target: str):
    def convert(em: AtenEmitter, a):
        return em.op(target, em.cast(a["self"], em.out_dtype()))
    return convert


def _bool_unary(target: str):
    return lambda em, a: em.op(target, a["self"])


register_many({f"{n}.default": n for n in _UNARY}, _unary)
register_many({f"{n}.default": n for n in _BOOL_UNARY}, _bool_unary)


@converts("round.default", ir="round")
def _round(em: AtenEmitter, a):
    return em.op("round", a["self"])


@converts("round.decimals", ir="round, mul, div")
def _round_decimals(em: AtenEmitter, a):
    """As ATen computes it: round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d for d < 0."""
    x, decimals = a["self"], a["decimals"]
    if decimals == 0:
        return em.op("round", x)
    scale = em.const(10.0 ** abs(decimals), x.dtype)
    inward, outward = ("mul", "div") if decimals > 0 else ("div", "mul")
    return em.op(outward, em.op("round", em.op(inward, x, scale)), scale)


@converts("gelu.default", ir="gelu")
def _gelu(em: AtenEmitter, a):
    return em.op("gelu", a["self"], approximate=a["approximate"])


@converts("leaky_relu.default", ir="leaky_relu")
def _leaky_relu(em: AtenEmitter, a):
    return em.op("leaky_relu", a["self"], negative_slope=float(a["negative_slope"]))


@converts("softplus.default", ir="softplus")
def _softplus(em: AtenEmitter, a):
    return em.op("softplus", a["self"], beta=float(a["beta"]), threshold=float(a["threshold"]))


@converts("elu.default", ir="elu")
def _elu(em: AtenEmitter, a):
    if a["scale"] != 1 or a["input_scale"] != 1:
        raise Unsupported("elu with scale or input_scale != 1 (selu/celu form)")
    return em.op("elu", a["self"], alpha=float(a["alpha"]))


# -- clamps ---------------------------------------------------------------------------------------
def _clamp_scalars(em: AtenEmitter, x, low, high):
    x = em.cast(x, em.out_dtype())
    cast = float if x.dtype.is_float else int
    return em.op("clamp", x, min=None if low is None else cast(low),
                 max=None if high is None else cast(high))


@converts("clamp.default", ir="clamp")
def _clamp(em: AtenEmitter, a):
    return _clamp_scalars(em, a["self"], a["min"], a["max"])


@converts("clamp_min.default", ir="clamp")
def _clamp_min(em: AtenEmitter, a):
    return _clamp_scalars(em, a["self"], a["min"], None)


@converts("clamp_max.default", ir="clamp")
def _clamp_max(em: AtenEmitter, a):
    return _clamp_scalars(em, a["self"], None, a["max"])


@converts("hardtanh.default", ir="clamp")
def _hardtanh(em: AtenEmitter, a):
    return _clamp_scalars(em, a["self"], a["min_val"], a["max_val"])


@converts("clamp.Tensor", "clamp_min.Tensor", "clamp_max.Tensor", ir="maximum, minimum")
def _clamp_tensor(em: AtenEmitter, a):
    dtype = em.out_dtype()
    x = em.cast(a["self"], dtype)
    if a.get("min") is not None:
        x = em.op("maximum", x, em.tensor(a["min"], dtype))
    if a.get("max") is not None:
        x = em.op("minimum", x, em.tensor(a["max"], dtype))
    return x


# -- binary ---------------------------------------------------------------------------------------
_BOOL_RESULT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"}


def _binary(target: str, first: str = "self", second: str = "other", reverse: bool = False):
    """`target(a[first], a[second])` (swapped when `reverse`), scaled by `alpha` if present."""
    def convert(em: AtenEmitter, a):
        x, y = a[first], a[second]
        dtype = em.result_type(x, y) if target in _BOOL_RESULT else em.out_dtype()
        x, y = em.tensor(x, dtype), em.tensor(y, dtype)
        if reverse:  # rsub(self, other, alpha) = other - alpha * self
            x, y = y, x
        if a.get("alpha", 1) != 1:
            y = em.op("mul", y, em.const(a["alpha"], dtype))
        return em.op(target, x, y)
    return convert


_BINARY = {
    "add": ["Tensor", "Scalar"], "sub": ["Tensor", "Scalar"], "mul": ["Tensor", "Scalar"],
    "div": ["Tensor", "Scalar"], "maximum": ["default"], "minimum": ["default"],
    "remainder": ["Tensor", "Scalar"], "fmod": ["Tensor", "Scalar"], "atan2": ["default"],
    "bitwise_and": ["Tensor", "Scalar"], "bitwise_or": ["Tensor", "Scalar"],
    "bitwise_xor": ["Tensor", "Scalar"], "logical_and": ["default"], "logical_or": ["default"],
    "logical_xor": ["default"], "eq": ["Tensor", "Scalar"], "ne": ["Tensor", "Scalar"],
    "lt": ["Tensor", "Scalar"], "le": ["Tensor", "Scalar"], "gt": ["Tensor", "Scalar"],
    "ge": ["Tensor", "Scalar"],
}
register_many({f"{op}.{ov}": op for op, overloads in _BINARY.items() for ov in overloads},
              _binary)
# The Python operators `a & b`, `a | b`, `a ^ b` stay as dunder overloads in torch.export's
# training IR; converting them lets a program skip run_decompositions altogether.
register_many({f"__{op}__.{ov}": f"bitwise_{op}" for op in ("and", "or", "xor")
               for ov in ("Tensor", "Scalar")}, _binary)
converts("remainder.Scalar_Tensor", ir="remainder")(_binary("remainder"))
converts("pow.Tensor_Tensor", "pow.Tensor_Scalar", ir="pow")(_binary("pow", second="exponent"))
converts("pow.Scalar", ir="pow")(_binary("pow", second="exponent"))
converts("rsub.Tensor", "rsub.Scalar", ir="sub")(_binary("sub", reverse=True))


@converts("div.Tensor_mode", "div.Scalar_mode", ir="div")
def _div_mode(em: AtenEmitter, a):
    dtype = em.out_dtype()
    x, y = em.tensor(a["self"], dtype), em.tensor(a["other"], dtype)
    return em.op("div", x, y, rounding_mode=a["rounding_mode"])


@converts("floor_divide.default", "floor_divide.Scalar", ir="div")
def _floor_divide(em: AtenEmitter, a):
    dtype = em.out_dtype()
    x, y = em.tensor(a["self"], dtype), em.tensor(a["other"], dtype)
    return em.op("div", x, y, rounding_mode="floor")


# -- selection and casts --------------------------------------------------------------------------
def _condition(em: AtenEmitter, cond):
    return em.cast(cond, DType.bool)


@converts("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar", ir="where")
def _where(em: AtenEmitter, a):
    dtype = em.out_dtype()
    return em.op("where", _condition(em, a["condition"]), em.tensor(a["self"], dtype),
                 em.tensor(a["other"], dtype))


@converts("masked_fill.Scalar", "masked_fill.Tensor", ir="where")
def _masked_fill(em: AtenEmitter, a):
    dtype = em.out_dtype()
    return em.op("where", _condition(em, a["mask"]), em.tensor(a["value"], dtype),
                 em.tensor(a["self"], dtype))


@converts("_to_copy.default", "to.dtype", "to.dtype_layout", "to.device", "to.other", ir="cast")
def _to_copy(em: AtenEmitter, a):
    """Every `.to(...)` form: the IR has one device and no layouts, so only the dtype counts
    (a functional graph never observes whether `.to` copied or aliased)."""
    return em.cast(a["self"], em.out_dtype())
