"""Elementwise ops: unary math, binary arithmetic and comparisons, where, clamp, cast.

Binary ops take operands of one dtype (the frontend inserts explicit casts where torch promotes),
and broadcast like numpy. Scalars are 0-d tensors made by `constant`.
"""

from __future__ import annotations

from ..dtypes import DType
from . import shape_rules as rules
from .registry import REQUIRED, define


def _torch():
    import torch

    return torch


def _aten(name: str):
    def run(*args, **kwargs):
        return getattr(_torch().ops.aten, name)(*args, **kwargs)
    return run


# name -> torch.ops.aten function computing it
UNARY_MATH = [
    "neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "sigmoid", "relu", "erf", "erfinv", "reciprocal", "floor", "ceil", "round", "trunc", "sign",
    "bitwise_not", "frac",
]
for _name in UNARY_MATH:
    define(_name, "x", rules.unary, _aten(_name), "elementwise", f"elementwise {_name}")

for _name in ["isnan", "isinf", "logical_not"]:
    define(_name, "x", rules.unary_to(DType.bool), _aten(_name), "elementwise",
           f"elementwise {_name}, bool result")

define("silu", "x", rules.unary, _aten("silu"), "elementwise", "x * sigmoid(x)")
define("gelu", "x", rules.unary, lambda x, approximate: _aten("gelu")(x, approximate=approximate),
       "elementwise", "GELU, erf form ('none') or tanh form ('tanh')", approximate="none")
define("leaky_relu", "x", rules.unary,
       lambda x, negative_slope: _aten("leaky_relu")(x, negative_slope), "elementwise",
       "max(x, 0) + slope * min(x, 0)", negative_slope=0.01)
define("softplus", "x", rules.unary,
       lambda x, beta, threshold: _aten("softplus")(x, beta, threshold),
       "elementwise", "log(1 + exp(beta x)) / beta, linear above threshold", beta=1.0,
       threshold=20.0)
define("hardsigmoid", "x", rules.unary, _aten("hardsigmoid"), "elementwise", "relu6(x + 3) / 6")
define("hardswish", "x", rules.unary, _aten("hardswish"), "elementwise", "x * relu6(x + 3) / 6")
define("elu", "x", rules.unary, lambda x, alpha: _aten("elu")(x, alpha), "elementwise",
       "x if x > 0 else alpha * (exp(x) - 1)", alpha=1.0)
define("clamp", "x", rules.unary, lambda x, min, max: _aten("clamp")(x, min, max), "elementwise",
       "clamp to [min, max]; either bound may be absent", min=None, max=None)


def _cast(x, dtype):
    return x.to(dtype.to_torch())


define("cast", "x", rules.cast, _cast, "elementwise", "convert to another dtype", dtype=REQUIRED)

BINARY = {
    "add": True, "sub": False, "mul": True, "pow": False, "maximum": True, "minimum": True,
    "remainder": False, "fmod": False, "atan2": False, "bitwise_and": True, "bitwise_or": True,
    "bitwise_xor": True, "logical_and": True, "logical_or": True, "logical_xor": True,
}
_BOOL_RESULT = {"logical_and", "logical_or", "logical_xor"}
for _name, _commutative in BINARY.items():
    rule = rules.compare if _name in _BOOL_RESULT else rules.binary
    define(_name, "a b", rule, _aten(_name), "elementwise", f"elementwise {_name}, broadcasting",
           commutative=_commutative)

define("div", "a b", rules.binary,
       lambda a, b, rounding_mode: _aten("div")(a, b, rounding_mode=rounding_mode),
       "elementwise", "a / b; rounding_mode none, 'trunc' or 'floor'", rounding_mode=None)

COMPARE = {"eq": True, "ne": True, "lt": False, "le": False, "gt": False, "ge": False}
for _name, _commutative in COMPARE.items():
    define(_name, "a b", rules.compare, _aten(_name), "elementwise", f"comparison {_name}",
           commutative=_commutative)

define("where", "cond a b", rules.where, _aten("where"), "elementwise",
       "select a where cond else b, broadcasting")
