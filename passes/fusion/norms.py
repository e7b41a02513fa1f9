"""RMSNorm and LayerNorm from their decomposed forms, their affine parameters, and the residual
add in front of a norm.

RMSNorm as transformers writes it (LlamaRMSNorm, T5LayerNorm, and the `/ sqrt` variant):
`x.to(f32); x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`, then `weight * x.to(dtype)`.
LayerNorm: `(x - mean) / sqrt(var + eps)` with the variance as a mean of squares or `var`
(correction 0). The core rules produce a norm without parameters; the affine rules fold a
following `* weight` and `+ bias` into it (only where that keeps the meaning: a weight after a
bias is not folded), so one rule set covers every combination. A cast between the norm and its
weight multiply (half-precision models) stays: the weight then applies in the narrow type.

The residual rules turn `norm(a + b)` into `add_rms_norm`/`add_layer_norm`, which also return
`a + b` for the residual stream.
"""

from __future__ import annotations

from ..rewrite import RuleSet, rule
from .common import same_shape, shape_is, trailing


def _mean_of_squares(op, x, dims_name: str):
    square = op.any_of(op.pow(x, 2.0), op.mul(x, x))
    return op.mean(square, dims=op.capture(dims_name), keepdim=True)


def _scaled(op, x, denom_sq):
    """x / sqrt(d) or x * rsqrt(d)."""
    return op.any_of(op.mul(x, op.rsqrt(denom_sq)), op.div(x, op.sqrt(denom_sq)))


def _rms_core(op, x):
    xf = op.any_of(op.cast(x), x, name="xf")
    return _scaled(op, xf, op.add(_mean_of_squares(op, xf, "dims"), op.const(name="eps")))


def _check_rms(ctx, xf, dims, eps, **_):
    if not xf.dtype.is_float:
        return f"%{xf.name} is not floating point"
    if trailing(dims, xf.type.rank) is None:
        return f"the mean is over dims {dims}, not the last dims of %{xf.name}"
    return None if isinstance(eps, float) else f"eps {eps!r} is not a float constant"


def _normalized(x, dims) -> list:
    return list(x.shape[x.type.rank - trailing(dims, x.type.rank):])


def _rms_rewrite(op, xf, dims, eps, **_):
    return op.rms_norm(xf, None, normalized_shape=_normalized(xf, dims), eps=eps)


def _ln_core(op, x):
    centered = op.sub(x, op.mean(x, dims=op.capture("dims"), keepdim=True))
    var = op.any_of(_mean_of_squares(op, centered, "var_dims"),
                    op.var(x, dims=op.capture("var_dims"), correction=0, keepdim=True))
    return _scaled(op, centered, op.add(var, op.const(name="eps")))


def _check_ln(ctx, x, dims, var_dims, eps, **_):
    rank = x.type.rank
    if trailing(dims, rank) is None or trailing(var_dims, rank) != trailing(dims, rank):
        return f"mean dims {dims} and variance dims {var_dims} are not the same last dims"
    if not x.dtype.is_float:
        return f"%{x.name} is not floating point"
    return None if isinstance(eps, float) else f"eps {eps!r} is not a float constant"


def _ln_rewrite(op, x, dims, eps, **_):
    return op.layer_norm(x, None, None, normalized_shape=_normalized(x, dims), eps=eps)


# -- affine parameters ---------------------------------------------------------------------------
def _param_fits(param, shape, norm) -> str | None:
    if param is None or not shape_is(param, shape) or param.dtype != norm.dtype:
        return f"%{getattr(param, 'name', '_')} is not a {norm.dtype}{list(shape)} parameter"
    return None


def _rms_weight_pattern(op, x, w):
    norm = op.rms_norm(x, None, normalized_shape=op.capture("shape"), eps=op.capture("eps"),
                       _name="norm")
    return op.mul(norm, w)


def _ln_weight_pattern(op, x, w):
    norm = op.layer_norm(x, None, None, normalized_shape=op.capture("shape"),
                         eps=op.capture("eps"), _name="norm")
    return op.mul(norm, w)


def _ln_bias_pattern(op, x, w, b):
    norm = op.layer_norm(x, w, None, normalized_shape=op.capture("shape"),
                         eps=op.capture("eps"), _name="norm")
    return op.add(norm, b)


def _check_weight(ctx, w, shape, norm, **_):
    return _param_fits(w, shape, norm)


def _check_bias(ctx, b, shape, norm, **_):
    return _param_fits(b, shape, norm)


# -- residual add before a norm ------------------------------------------------------------------
def _add_rms_pattern(op, a, b, w):
    total = op.add(a, b, _name="sum")
    return op.rms_norm(total, w, normalized_shape=op.capture("shape"), eps=op.capture("eps"),
                       _name="out")


def _add_ln_pattern(op, a, b, w, bias):
    total = op.add(a, b, _name="sum")
    return op.layer_norm(total, w, bias, normalized_shape=op.capture("shape"),
                         eps=op.capture("eps"), _name="out")


def _check_residual(ctx, a, b, sum, **_):
    if not (same_shape(a, sum) and same_shape(b, sum)):
        return f"%{sum.name} broadcasts its operands: a bias or mask add, not a residual add"
    return None


def _add_rms_rewrite(op, a, b, w, shape, eps, **_):
    out, total = op.ops("add_rms_norm", a, b, w, normalized_shape=shape, eps=eps)
    return {"out": out, "sum": total}


def _add_ln_rewrite(op, a, b, w, bias, shape, eps, **_):
    out, total = op.ops("add_layer_norm", a, b, w, bias, normalized_shape=shape, eps=eps)
    return {"out": out, "sum": total}


RMS_NORM = rule("rms_norm", _rms_core, _rms_rewrite, check=_check_rms)
LAYER_NORM = rule("layer_norm", _ln_core, _ln_rewrite, check=_check_ln)
RMS_NORM_WEIGHT = rule(
    "rms_norm_weight", _rms_weight_pattern,
    lambda op, x, w, shape, eps, **_: op.rms_norm(x, w, normalized_shape=shape, eps=eps),
    check=_check_weight)
LAYER_NORM_WEIGHT = rule(
    "layer_norm_weight", _ln_weight_pattern,
    lambda op, x, w, shape, eps, **_: op.layer_norm(x, w, None, normalized_shape=shape, eps=eps),
    check=_check_weight)
LAYER_NORM_BIAS = rule(
    "layer_norm_bias", _ln_bias_pattern,
    lambda op, x, w, b, shape, eps, **_: op.layer_norm(x, w, b, normalized_shape=shape, eps=eps),
    check=_check_bias)
ADD_RMS_NORM = rule("add_rms_norm", _add_rms_pattern, _add_rms_rewrite, check=_check_residual,
                    replaces=["sum"])
ADD_LAYER_NORM = rule("add_layer_norm", _add_ln_pattern, _add_ln_rewrite,
                      check=_check_residual, replaces=["sum"])

# LayerNorm before RMSNorm: `(x - mean) / sqrt(mean((x - mean)^2) + eps)` is also an RMSNorm of
# the centered x, and the rule tried first at a node wins.
RULES = RuleSet([LAYER_NORM, RMS_NORM, RMS_NORM_WEIGHT, LAYER_NORM_WEIGHT, LAYER_NORM_BIAS],
                "norms")
RESIDUAL_RULES = RuleSet([ADD_RMS_NORM, ADD_LAYER_NORM], "residual")
