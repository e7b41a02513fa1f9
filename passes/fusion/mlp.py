"""Gated MLPs and linear epilogues.

- `gated_mlp`: `down(act(gate(x)) * up(x))` with act silu (SwiGLU: Llama, Mistral, Qwen), gelu
  in either form (GeGLU: Gemma, T5 v1.1) or relu, becomes one `gated_mlp` node.
- `linear_bias`: `linear(x, w) + b` becomes `linear(x, w, b)`; `matmul(x, w) + b` with a 2-d `w`
  (GPT-2's Conv1D, `addmm`) becomes `fused_linear` with weight_layout in_out, so the weight is
  used as stored and never transposed.
- `linear_activation`: an activation applied to a linear (or to a reshape of one, as GPT-2's MLP
  reshapes between them) becomes the `fused_linear` epilogue.
"""

from __future__ import annotations

from ..rewrite import RuleSet, rule
from .common import ACTIVATION_OPS, activation_name, misfit, shape_is


def _activation_of(op, x, name: str = "act"):
    return op.any_of(*(getattr(op, a)(x) for a in ACTIVATION_OPS), name=name)


def _gated(op, x, w_gate, b_gate, w_up, b_up, w_down, b_down):
    act = _activation_of(op, op.linear(x, w_gate, b_gate))
    return op.linear(op.mul(act, op.linear(x, w_up, b_up)), w_down, b_down)


def _check_gated(ctx, x, w_gate, b_gate, w_up, b_up, w_down, b_down, act, **_):
    name = activation_name(act)
    if name is None:
        return f"{act.producer.op} is not an activation gated_mlp supports"
    return misfit("gated_mlp", [x, w_gate, w_up, w_down, b_gate, b_up, b_down], activation=name)


def _gated_rewrite(op, x, w_gate, b_gate, w_up, b_up, w_down, b_down, act, **_):
    return op.gated_mlp(x, w_gate, w_up, w_down, b_gate, b_up, b_down,
                        activation=activation_name(act))


# -- bias ----------------------------------------------------------------------------------------
def _linear_bias(op, x, w, b):
    return op.add(op.linear(x, w, None, _name="lin"), b)


def _matmul_bias(op, x, w, b):
    return op.add(op.matmul(x, w, _name="lin"), b)


def _check_bias(ctx, w, b, lin, **_):
    out = lin.shape[-1] if lin.type.rank else None
    if out is None or not shape_is(b, [out]) or b.dtype != lin.dtype:
        return f"%{b.name} is not a bias of shape [{out}]"
    if w.type.rank != 2:
        return f"%{w.name} is not a 2-d weight"
    return None


# -- activation epilogue -------------------------------------------------------------------------
def _linear_of(op, x, w, b):
    return op.any_of(op.linear(x, w, b),
                     op.fused_linear(x, w, b, activation="none",
                                     weight_layout=op.capture("layout")), name="lin")


def _activation(op, x, w, b):
    return _activation_of(op, _linear_of(op, x, w, b), name="out")


def _activation_view(op, x, w, b):
    return _activation_of(op, op.reshape(_linear_of(op, x, w, b), shape=op.capture("shape"),
                                         _name="view"), name="out")


def _check_activation(ctx, out, **_):
    return None if activation_name(out) else f"{out.producer.op} is not a supported activation"


def _epilogue(op, x, w, b, out, layout="out_in", **_):
    return op.fused_linear(x, w, b, activation=activation_name(out), weight_layout=layout)


def _epilogue_view(op, x, w, b, out, shape, layout="out_in", **_):
    return op.reshape(_epilogue(op, x, w, b, out, layout), shape=shape)


GATED_MLP = rule("gated_mlp", _gated, _gated_rewrite, check=_check_gated)
LINEAR_BIAS = rule("linear_bias", _linear_bias, lambda op, x, w, b, **_: op.linear(x, w, b),
                   check=_check_bias)
MATMUL_BIAS = rule("matmul_bias", _matmul_bias,
                   lambda op, x, w, b, **_: op.fused_linear(x, w, b, weight_layout="in_out"),
                   check=_check_bias)
LINEAR_ACTIVATION = rule("linear_activation", _activation, _epilogue, check=_check_activation)
LINEAR_VIEW_ACTIVATION = rule("linear_view_activation", _activation_view, _epilogue_view,
                              check=_check_activation)

GATED_RULES = RuleSet([GATED_MLP], "mlp")
EPILOGUE_RULES = RuleSet([LINEAR_BIAS, MATMUL_BIAS, LINEAR_ACTIVATION, LINEAR_VIEW_ACTIVATION],
                         "epilogue")
