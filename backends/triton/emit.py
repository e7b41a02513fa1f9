"""Triton expressions for single IR ops: the table the kernel generator reads.

Each elementwise op maps to a function (operand expressions, attributes) -> expression string;
floating values are computed in fp32 inside kernels and cast on store. Ops or attribute values
missing here are not generated (the backend reports them as unsupported, so the partitioner
sends them to the fallback). Tables, not if-chains: adding an op is one line.

Operand expressions are the generator's own identifiers. An attribute reaches the text only as
a number written by `source_guard.number` or as the entry a string attribute selects from a
table (`source_guard.choice`): graph.dzir is untrusted, and this text is executed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from string import Formatter
from typing import Any

from .source_guard import NotOneKernel, choice, number

Emit = Callable[[list[str], Mapping[str, Any]], str]

_SQRT1_2 = "0.7071067811865476"


def _f(template: str) -> Emit:
    """An emitter from a format template: `{0}`, `{1}` are operand expressions, a named field
    `{beta}` is that numeric attribute, written by `number` (never the attribute's text)."""
    fields = sorted({f for _, f, _, _ in Formatter().parse(template) if f and not f.isdigit()})
    return lambda a, attrs: template.format(*a, **{k: number(attrs[k], k) for k in fields})


# torch's maximum, minimum, clamp and relu propagate NaN; Triton's return the other operand
# unless told otherwise (PropagateNan.NONE is its default, on GPUs and in the interpreter).
_NAN = "propagate_nan=tl.PropagateNan.ALL"


def _max(a: str, b: str) -> str:
    return f"tl.maximum({a}, {b}, {_NAN})"


def _min(a: str, b: str) -> str:
    return f"tl.minimum({a}, {b}, {_NAN})"


def _tanh(x: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * ({x})) - 1.0)"


def _gelu_tanh(x: str) -> str:
    inner = f"0.7978845608028654 * (({x}) + 0.044715 * ({x}) * ({x}) * ({x}))"
    return f"(0.5 * ({x}) * (1.0 + {_tanh(inner)}))"


# gelu's `approximate` selects a form; the attribute's text is never written
_GELU: dict[str, Callable[[str], str]] = {
    "none": lambda x: f"(0.5 * ({x}) * (1.0 + tl.erf(({x}) * {_SQRT1_2})))",
    "tanh": _gelu_tanh,
}


def _gelu(a: list[str], attrs: Mapping[str, Any]) -> str:
    return choice(attrs.get("approximate", "none"), _GELU, "approximate")(a[0])


def _clamp(a: list[str], attrs: Mapping[str, Any]) -> str:
    x = a[0]
    if attrs.get("min") is not None:
        x = _max(x, number(attrs["min"], "min", as_float=True))
    if attrs.get("max") is not None:
        x = _min(x, number(attrs["max"], "max", as_float=True))
    return x


def _trunc(x: str) -> str:
    return f"tl.where({x} < 0, tl.ceil({x}), tl.floor({x}))"


def _round(a: list[str], attrs: Mapping[str, Any]) -> str:
    """Half to even, as torch rounds: x - floor(x) is exact, so ties are seen exactly."""
    x = a[0]
    low, frac = f"tl.floor({x})", f"({x} - tl.floor({x}))"
    odd = f"({low} - 2.0 * tl.floor({low} * 0.5) != 0)"
    return f"tl.where(({frac} > 0.5) | (({frac} == 0.5) & {odd}), {low} + 1.0, {low})"


# e^(x - ln 2) is e^x / 2 without overflowing where e^x alone would (x in (88.7, 89.4)).
_HALF_EXP = "tl.exp({} - 0.6931471805599453)"


def _sinh(x: str) -> str:
    """Near 0 the difference of exponentials cancels: a Taylor series there (|x| < 0.5)."""
    x2 = f"({x} * {x})"
    series = f"({x} * (1.0 + {x2} / 6.0 * (1.0 + {x2} / 20.0 * (1.0 + {x2} / 42.0))))"
    exps = f"({_HALF_EXP.format(x)} - {_HALF_EXP.format('-' + x)})"
    return f"tl.where(tl.abs({x}) < 0.5, {series}, {exps})"


ELEMENTWISE: dict[str, Emit] = {
    "add": _f("({0} + {1})"),
    "sub": _f("({0} - {1})"),
    "mul": _f("({0} * {1})"),
    "div": _f("({0} / {1})"),
    "neg": _f("(-{0})"),
    "abs": _f("tl.abs({0})"),
    "exp": _f("tl.exp({0})"),
    "exp2": _f("tl.exp2({0})"),
    "log": _f("tl.log({0})"),
    "log2": _f("tl.log2({0})"),
    "log10": _f("(tl.log({0}) * 0.4342944819032518)"),
    "log1p": _f("tl.log(1.0 + {0})"),
    "expm1": _f("(tl.exp({0}) - 1.0)"),
    "sqrt": _f("tl.sqrt({0})"),
    "rsqrt": _f("tl.rsqrt({0})"),
    "reciprocal": _f("(1.0 / {0})"),
    "sigmoid": _f("tl.sigmoid({0})"),
    "tanh": lambda a, attrs: _tanh(a[0]),
    "relu": lambda a, attrs: _max(a[0], "0.0"),
    "silu": _f("({0} * tl.sigmoid({0}))"),
    "gelu": _gelu,
    "erf": _f("tl.erf({0})"),
    "sin": _f("tl.sin({0})"),
    "cos": _f("tl.cos({0})"),
    "tan": _f("(tl.sin({0}) / tl.cos({0}))"),
    "sinh": lambda a, attrs: _sinh(a[0]),
    "cosh": lambda a, attrs: f"({_HALF_EXP.format(a[0])} + {_HALF_EXP.format('-' + a[0])})",
    "softplus": _f("tl.where({0} * {beta} > {threshold}, {0}, "
                   "tl.log(1.0 + tl.exp({0} * {beta})) / {beta})"),
    "floor": _f("tl.floor({0})"),
    "ceil": _f("tl.ceil({0})"),
    "trunc": lambda a, attrs: _trunc(a[0]),
    "frac": lambda a, attrs: f"({a[0]} - {_trunc(a[0])})",
    "round": _round,
    "sign": _f("(tl.where({0} > 0, 1, 0) - tl.where({0} < 0, 1, 0))"),  # sign(nan) is 0
    "isnan": _f("({0} != {0})"),
    "isinf": _f("(tl.abs({0}) == float('inf'))"),
    "maximum": lambda a, attrs: _max(a[0], a[1]),
    "minimum": lambda a, attrs: _min(a[0], a[1]),
    "clamp": _clamp,
    "leaky_relu": _f("tl.where({0} > 0, {0}, {0} * {negative_slope})"),
    "elu": _f("tl.where({0} > 0, {0}, {alpha} * (tl.exp({0}) - 1.0))"),
    "hardsigmoid": lambda a, attrs: _min(_max(f"{a[0]} / 6.0 + 0.5", "0.0"), "1.0"),
    "hardswish": lambda a, attrs: f"({a[0]} * {_min(_max(f'{a[0]} / 6.0 + 0.5', '0.0'), '1.0')})",
    "where": _f("tl.where({0}, {1}, {2})"),
    "eq": _f("({0} == {1})"),
    "ne": _f("({0} != {1})"),
    "lt": _f("({0} < {1})"),
    "le": _f("({0} <= {1})"),
    "gt": _f("({0} > {1})"),
    "ge": _f("({0} >= {1})"),
    "logical_and": _f("(({0} != 0) & ({1} != 0))"),
    "logical_or": _f("(({0} != 0) | ({1} != 0))"),
    "logical_not": _f("({0} == 0)"),
    "logical_xor": _f("(({0} != 0) ^ ({1} != 0))"),
    "bitwise_and": _f("({0} & {1})"),
    "bitwise_or": _f("({0} | {1})"),
    "bitwise_xor": _f("({0} ^ {1})"),
    "cast": _f("{0}"),  # the cast happens where the value is stored or compared
}

# pow with a constant exponent: the exponents models use (x^2 in decomposed norms, x^3 in gelu).
POW_EXPONENTS: dict[float, str] = {
    1.0: "({0})", 2.0: "({0} * {0})", 3.0: "({0} * {0} * {0})", 0.5: "tl.sqrt({0})",
    -0.5: "tl.rsqrt({0})", -1.0: "(1.0 / {0})",
}

# Row reductions: op -> function(vector expr, mask, count expr, attrs) -> list of lines
# computing the result into `{out}` (a per-row scalar, or a vector for softmax).
ROW_OPS = ("sum", "mean", "amax", "amin", "var", "softmax", "log_softmax", "layer_norm",
           "rms_norm")
VECTOR_RESULT = frozenset({"softmax", "log_softmax", "layer_norm", "rms_norm"})


def row_lines(op: str, out: str, x: str, args: list[str], attrs: Mapping[str, Any]) -> list[str]:
    """Lines computing reduction `op` of vector `x` (masked by `mask`, length `R`) into `out`."""
    zero = f"tl.where(mask, {x}, 0.0)"
    if op == "sum":
        return [f"{out} = tl.sum({zero}, axis=0)"]
    if op == "mean":
        return [f"{out} = tl.sum({zero}, axis=0) / R"]
    if op in ("amax", "amin"):
        fill, fn = ("float('-inf')", "tl.max") if op == "amax" else ("float('inf')", "tl.min")
        return [f"{out} = {fn}(tl.where(mask, {x}, {fill}), axis=0)"]
    if op == "var":  # divided as torch divides: by max(R - correction, 0)
        return [f"{out}_m = tl.sum({zero}, axis=0) / R",
                f"{out}_d = tl.where(mask, {x} - {out}_m, 0.0)",
                f"{out} = tl.sum({out}_d * {out}_d, axis=0) / "
                f"tl.maximum(R - {number(attrs['correction'], 'correction', True)}, 0.0)"]
    if op in ("softmax", "log_softmax"):
        lines = [f"{out}_m = tl.max(tl.where(mask, {x}, float('-inf')), axis=0)",
                 f"{out}_e = tl.where(mask, tl.exp({x} - {out}_m), 0.0)",
                 f"{out}_s = tl.sum({out}_e, axis=0)"]
        if op == "softmax":
            return [*lines, f"{out} = {out}_e / {out}_s"]
        return [*lines, f"{out} = {x} - {out}_m - tl.log({out}_s)"]
    if attrs.get("eps") is None:  # rms_norm's default eps depends on the dtype: on the host
        raise NotOneKernel(f"{op} with eps none")
    eps = number(attrs["eps"], "eps", as_float=True)
    if op == "layer_norm":
        lines = [f"{out}_m = tl.sum({zero}, axis=0) / R",
                 f"{out}_d = tl.where(mask, {x} - {out}_m, 0.0)",
                 f"{out}_v = tl.sum({out}_d * {out}_d, axis=0) / R",
                 f"{out} = {out}_d * tl.rsqrt({out}_v + {eps})"]
    else:  # rms_norm
        lines = [f"{out}_v = tl.sum({zero} * {zero}, axis=0) / R",
                 f"{out} = {x} * tl.rsqrt({out}_v + {eps})"]
    for extra, arg in zip(("*", "+"), args):
        if arg is not None:
            lines.append(f"{out} = {out} {extra} {arg}")
    return lines

# Arithmetic on bool tensors is logic in torch (True + True is True).
BOOL_OPS = {"add": "logical_or", "mul": "logical_and", "maximum": "logical_or",
            "minimum": "logical_and"}
# Rounding an integer is the identity.
INT_IDENTITY = frozenset({"floor", "ceil", "trunc", "round"})
