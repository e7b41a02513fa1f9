"""Converters for elementwise IR ops: one entry per op, plain ONNX ops or short compositions.

A converter takes the builder, the IR node and the ONNX names of its inputs (None for an absent
optional operand) and returns the ONNX names of its outputs. Ops with a direct ONNX equivalent are
table rows (`DIRECT`); the rest are small functions whose docstrings say why they are composed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from compiler.ir import DType, Node

from .builder import ONNX_DTYPES, Builder

Converter = Callable[[Builder, Node, list], list]

DIRECT = {
    "neg": "Neg", "abs": "Abs", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "sin": "Sin",
    "cos": "Cos", "tan": "Tan", "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh",
    "cosh": "Cosh", "tanh": "Tanh", "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh",
    "sigmoid": "Sigmoid", "erf": "Erf", "reciprocal": "Reciprocal", "sign": "Sign",
    "isnan": "IsNaN", "isinf": "IsInf", "logical_not": "Not", "hardswish": "HardSwish",
    "add": "Add", "sub": "Sub", "mul": "Mul", "pow": "Pow", "maximum": "Max", "minimum": "Min",
    "eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual",
    "where": "Where",
}
# Rounding ops are the identity on integers (as in torch); ONNX defines them for floats only.
ROUNDING = {"floor": "Floor", "ceil": "Ceil", "round": "Round"}
BITWISE = {"bitwise_and": ("BitwiseAnd", "And"), "bitwise_or": ("BitwiseOr", "Or"),
           "bitwise_xor": ("BitwiseXor", "Xor")}
LOGICAL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}
# Operators torch applies to bool tensors that ONNX only defines on numbers or on bools.
BOOL_ARITH = {"add": "Or", "mul": "And", "maximum": "Or", "minimum": "And"}
ORDERED = {"lt", "le", "gt", "ge"}


def in_dtype(node: Node, i: int = 0) -> DType:
    return node.inputs[i].type.dtype


def out_dtype(node: Node) -> DType:
    return node.outputs[0].type.dtype


def direct(b: Builder, node: Node, x: list) -> list:
    dtype = in_dtype(node)
    if dtype == DType.bool and node.op in BOOL_ARITH:
        return [b.op1(BOOL_ARITH[node.op], x)]
    if dtype == DType.bool and node.op in ORDERED:
        x = [b.op1("Cast", [v], to=ONNX_DTYPES[DType.i32]) for v in x]
    return [b.op1(DIRECT[node.op], x)]


def rounding(b: Builder, node: Node, x: list) -> list:
    if not in_dtype(node).is_float:
        return [b.op1("Identity", x)]
    return [b.op1(ROUNDING[node.op], x)]


def trunc_of(b: Builder, x: str, dtype: DType) -> str:
    """ONNX has no Trunc: ceil below zero, floor above."""
    if not dtype.is_float:
        return x
    negative = b.op1("Less", [x, b.const(0, dtype)])
    return b.op1("Where", [negative, b.op1("Ceil", [x]), b.op1("Floor", [x])])


def trunc(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Identity", [trunc_of(b, x[0], in_dtype(node))])]


def frac(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Sub", [x[0], trunc_of(b, x[0], in_dtype(node))])]


def unary_math(b: Builder, node: Node, x: list) -> list:
    """Math functions ONNX lacks, written with the ones it has."""
    v, dtype = x[0], in_dtype(node)
    c = lambda value: b.const(value, dtype)
    build = {
        "exp2": lambda: b.op1("Pow", [c(2.0), v]),
        "expm1": lambda: b.op1("Sub", [b.op1("Exp", [v]), c(1.0)]),
        "log2": lambda: b.op1("Div", [b.op1("Log", [v]), c(math.log(2.0))]),
        "log10": lambda: b.op1("Div", [b.op1("Log", [v]), c(math.log(10.0))]),
        "log1p": lambda: b.op1("Log", [b.op1("Add", [v, c(1.0)])]),
        "rsqrt": lambda: b.op1("Reciprocal", [b.op1("Sqrt", [v])]),
        "relu": lambda: b.op1("Relu", [v]) if dtype.is_float else b.op1("Max", [v, c(0)]),
        "silu": lambda: b.op1("Mul", [v, b.op1("Sigmoid", [v])]),
        "hardsigmoid": lambda: b.op1("HardSigmoid", [v], alpha=1.0 / 6.0, beta=0.5),
    }
    return [build[node.op]()]


def gelu(b: Builder, node: Node, x: list) -> list:
    """The erf form 0.5 x (1 + erf(x / sqrt 2)), or the tanh form; ORT fuses either into Gelu."""
    v, dtype = x[0], in_dtype(node)
    c = lambda value: b.const(value, dtype)
    if node.attrs["approximate"] == "tanh":
        cube = b.op1("Mul", [b.op1("Mul", [v, v]), v])
        inner = b.op1("Add", [v, b.op1("Mul", [cube, c(0.044715)])])
        t = b.op1("Tanh", [b.op1("Mul", [inner, c(math.sqrt(2.0 / math.pi))])])
    else:
        t = b.op1("Erf", [b.op1("Div", [v, c(math.sqrt(2.0))])])
    half = b.op1("Mul", [v, c(0.5)])
    return [b.op1("Mul", [half, b.op1("Add", [t, c(1.0)])])]


def leaky_relu(b: Builder, node: Node, x: list) -> list:
    return [b.op1("LeakyRelu", x, alpha=float(node.attrs["negative_slope"]))]


def elu(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Elu", x, alpha=float(node.attrs["alpha"]))]


def softplus(b: Builder, node: Node, x: list) -> list:
    """torch's softplus is linear where beta * x exceeds the threshold; ONNX's has neither knob."""
    dtype, beta = in_dtype(node), float(node.attrs["beta"])
    scaled = b.op1("Mul", [x[0], b.const(beta, dtype)])
    soft = b.op1("Div", [b.op1("Softplus", [scaled]), b.const(beta, dtype)])
    linear = b.op1("Greater", [scaled, b.const(float(node.attrs["threshold"]), dtype)])
    return [b.op1("Where", [linear, x[0], soft])]


def clamp(b: Builder, node: Node, x: list) -> list:
    dtype = in_dtype(node)
    bound = lambda v: None if v is None else b.const(v if dtype.is_float else int(v), dtype)
    return [b.op1("Clip", [x[0], bound(node.attrs["min"]), bound(node.attrs["max"])])]


def cast(b: Builder, node: Node, x: list) -> list:
    if node.attrs["dtype"] == in_dtype(node):
        return [b.op1("Identity", x)]
    return [b.op1("Cast", x, to=ONNX_DTYPES[node.attrs["dtype"]])]


def bitwise(b: Builder, node: Node, x: list) -> list:
    numeric, boolean = BITWISE.get(node.op, ("BitwiseNot", "Not"))
    return [b.op1(boolean if in_dtype(node) == DType.bool else numeric, x)]


def logical(b: Builder, node: Node, x: list) -> list:
    """torch's logical ops take any dtype (nonzero is true); ONNX's take bools."""
    if in_dtype(node) != DType.bool:
        x = [b.op1("Cast", [v], to=ONNX_DTYPES[DType.bool]) for v in x]
    return [b.op1(LOGICAL[node.op], x)]


def ne(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Not", [b.op1("Equal", x)])]


def fmod(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Mod", x, fmod=1)]


def remainder(b: Builder, node: Node, x: list) -> list:
    """Python-style modulo (sign of the divisor), as torch computes it: fmod, then shift."""
    if not in_dtype(node).is_float:
        return [b.op1("Mod", x, fmod=0)]
    a, d = x
    r = b.op1("Mod", [a, d], fmod=1)
    zero = b.const(0.0, in_dtype(node))
    differ = b.op1("Xor", [b.op1("Less", [r, zero]), b.op1("Less", [d, zero])])
    shift = b.op1("And", [differ, b.op1("Not", [b.op1("Equal", [r, zero])])])
    return [b.op1("Where", [shift, b.op1("Add", [r, d]), r])]


def div(b: Builder, node: Node, x: list) -> list:
    dtype, mode = in_dtype(node), node.attrs["rounding_mode"]
    q = b.op1("Div", x)
    if mode == "trunc" or (mode is None and not dtype.is_float):
        return [b.op1("Identity", [trunc_of(b, q, dtype)])]
    if mode is None:
        return [q]
    if dtype.is_float:
        return [b.op1("Floor", [q])]
    # integer floor division: ONNX's Div truncates; step down where signs differ and r != 0
    r = b.op1("Mod", x, fmod=1)
    zero = b.const(0, dtype)
    differ = b.op1("Xor", [b.op1("Less", [r, zero]), b.op1("Less", [x[1], zero])])
    step = b.op1("And", [differ, b.op1("Not", [b.op1("Equal", [r, zero])])])
    return [b.op1("Where", [step, b.op1("Sub", [q, b.const(1, dtype)]), q])]


def atan2(b: Builder, node: Node, x: list) -> list:
    """atan(a / b) moved into the right quadrant; the b == 0 column is +-pi/2 (or 0)."""
    a, d = x
    dtype = in_dtype(node)
    c = lambda value: b.const(value, dtype)
    base = b.op1("Atan", [b.op1("Div", [a, d])])
    a_neg = b.op1("Less", [a, c(0.0)])
    turn = b.op1("Where", [a_neg, c(-math.pi), c(math.pi)])
    left = b.op1("Add", [base, turn])
    axis = b.op1("Where", [a_neg, c(-math.pi / 2), b.op1("Where", [
        b.op1("Greater", [a, c(0.0)]), c(math.pi / 2), c(0.0)])])
    out = b.op1("Where", [b.op1("Less", [d, c(0.0)]), left, base])
    return [b.op1("Where", [b.op1("Equal", [d, c(0.0)]), axis, out])]


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision.
_ERFINV_CENTRAL = [2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                   0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941]
_ERFINV_TAIL = [-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682]


def erfinv(b: Builder, node: Node, x: list) -> list:
    """ONNX has no erfinv: Giles' polynomial pair, one Newton step on erf, and the +-1 poles."""
    v, dtype = x[0], in_dtype(node)
    c = lambda value: b.const(value, dtype)
    one = c(1.0)
    w = b.op1("Neg", [b.op1("Log", [b.op1("Mul", [b.op1("Sub", [one, v]),
                                                  b.op1("Add", [one, v])])])])
    central = _horner(b, b.op1("Sub", [w, c(2.5)]), _ERFINV_CENTRAL, dtype)
    tail = _horner(b, b.op1("Sub", [b.op1("Sqrt", [w]), c(3.0)]), _ERFINV_TAIL, dtype)
    y = b.op1("Mul", [b.op1("Where", [b.op1("Less", [w, c(5.0)]), central, tail]), v])
    slope = b.op1("Mul", [c(2.0 / math.sqrt(math.pi)),
                          b.op1("Exp", [b.op1("Neg", [b.op1("Mul", [y, y])])])])
    err = b.op1("Sub", [b.op1("Erf", [y]), v])
    y = b.op1("Sub", [y, b.op1("Div", [err, slope])])
    pole = b.op1("Equal", [b.op1("Abs", [v]), one])
    return [b.op1("Where", [pole, b.op1("Mul", [v, c(math.inf)]), y])]


def _horner(b: Builder, w: str, coeffs: list[float], dtype: DType) -> str:
    p = b.const(coeffs[0], dtype)
    for coeff in coeffs[1:]:
        p = b.op1("Add", [b.const(coeff, dtype), b.op1("Mul", [p, w])])
    return p


def table() -> dict[str, Converter]:
    entries: dict[str, Converter] = {name: direct for name in DIRECT}
    entries.update({name: rounding for name in ROUNDING})
    entries.update({name: unary_math for name in
                    ("exp2", "expm1", "log2", "log10", "log1p", "rsqrt", "relu", "silu",
                     "hardsigmoid")})
    entries.update({name: bitwise for name in (*BITWISE, "bitwise_not")})
    entries.update({name: logical for name in LOGICAL})
    entries.update(trunc=trunc, frac=frac, gelu=gelu, leaky_relu=leaky_relu, elu=elu,
                   softplus=softplus, clamp=clamp, cast=cast, ne=ne, fmod=fmod,
                   remainder=remainder, div=div, atan2=atan2, erfinv=erfinv)
    return entries
