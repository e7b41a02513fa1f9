"""Activation functions written out elementwise, folded back into one op.

GELU in its erf form `x * 0.5 * (1 + erf(x / sqrt(2)))` and its tanh form (GPT-2's NewGELU,
`0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`), SiLU `x * sigmoid(x)` and QuickGELU
`x * sigmoid(1.702 * x)` (CLIP's vision and text towers), in the operand orders and associations
models write them.
"""

from __future__ import annotations

import math

from ..rewrite import RuleSet, rule

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _cube(op, x):
    return op.any_of(op.pow(x, 3.0), op.mul(op.mul(x, x), x), op.mul(x, op.mul(x, x)))


def _half_x_times(op, x, factor):
    """0.5 * x * factor, associated either way."""
    return op.any_of(op.mul(op.mul(x, 0.5), factor), op.mul(x, op.mul(factor, 0.5)),
                     op.div(op.mul(x, factor), 2.0))


def _gelu_tanh(op, x):
    inner = op.add(x, op.mul(_cube(op, x), 0.044715))
    return _half_x_times(op, x, op.add(op.tanh(op.mul(inner, SQRT_2_OVER_PI)), 1.0))


def _gelu_erf(op, x):
    scaled = op.any_of(op.div(x, math.sqrt(2.0)), op.mul(x, math.sqrt(0.5)))
    return _half_x_times(op, x, op.add(op.erf(scaled), 1.0))


def _float(ctx, x, **_):
    return None if x.dtype.is_float else f"%{x.name} is not floating point"


GELU_TANH = rule("gelu_tanh", _gelu_tanh,
                 lambda op, x, **_: op.gelu(x, approximate="tanh"), check=_float)
GELU_ERF = rule("gelu_erf", _gelu_erf, lambda op, x, **_: op.gelu(x, approximate="none"),
                check=_float)
SILU = rule("silu", lambda op, x: op.mul(x, op.sigmoid(x)), lambda op, x, **_: op.silu(x),
            check=_float)

def _quick_gelu(op, x):
    return op.mul(x, op.sigmoid(op.mul(x, op.const(name="alpha"))))


QUICK_GELU = rule("quick_gelu", _quick_gelu,
                  lambda op, x, alpha, **_: op.quick_gelu(x, alpha=float(alpha)), check=_float)

RULES = RuleSet([GELU_TANH, GELU_ERF, SILU, QUICK_GELU], "activations")
