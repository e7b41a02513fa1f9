"""A MoE block's shared expert joins its `moe` node: the whole block becomes one op.

The shared expert is a dense gated MLP every token runs beside the routed experts, added to
their sum: as is (DeepSeek-V2/V3, GLM-4-MoE: `experts(x).view(shape) + shared_experts(x)`) or
scaled by a sigmoid gate of the tokens (Qwen2-MoE: `experts(x) + sigmoid(gate(x)) *
shared_expert(x)`). These rules run once `moe` and `gated_mlp` have formed (the second fusion
phase), and fold the gated MLP's weights (and the gate's) into the `moe` node's shared inputs.
"""

from __future__ import annotations

from compiler.ir import get_op

from ..rewrite import rule
from .common import same_shape

SHARED_INPUTS = 4  # shared_w_gate, shared_w_up, shared_w_down, shared_gate


def _routed(op, x, logits, w1, w2, b1, b2, sb):
    return op.moe(x, logits, w1, w2, b1, b2, sb, _name="routed")


def _dense(op, xs, sg, su, sd, bg, bu, bd):
    return op.gated_mlp(xs, sg, su, sd, bg, bu, bd, _name="dense")


def _plain(op, x, logits, w1, w2, b1, b2, sb, xs, sg, su, sd, bg, bu, bd):
    return op.add(_routed(op, x, logits, w1, w2, b1, b2, sb),
                  _dense(op, xs, sg, su, sd, bg, bu, bd))


def _viewed(op, x, logits, w1, w2, b1, b2, sb, xs, sg, su, sd, bg, bu, bd):
    view = op.reshape(_routed(op, x, logits, w1, w2, b1, b2, sb), shape=op.capture("shape"),
                      _name="view")
    return op.add(view, _dense(op, xs, sg, su, sd, bg, bu, bd))


def _gated(op, x, logits, w1, w2, b1, b2, sb, xs, sg, su, sd, bg, bu, bd, xg, gate):
    scale = op.sigmoid(op.linear(xg, gate, None))
    return op.add(_routed(op, x, logits, w1, w2, b1, b2, sb),
                  op.mul(scale, _dense(op, xs, sg, su, sd, bg, bu, bd)))


def _same_tokens(x, xs) -> bool:
    """xs is x, or x is xs viewed as [tokens, hidden] (the MLP runs row by row either way)."""
    if xs is x:
        return True
    node = x.producer
    return node is not None and node.op == "reshape" and node.inputs[0] is xs


def _check(ctx, x, xs, bg, bu, bd, routed, dense, view=None, xg=None, **_):
    node = routed.producer
    if len(node.inputs) > 7:
        return "the moe node has its shared expert already"
    if (bg, bu, bd) != (None, None, None):
        return "the shared expert has biases, which moe's shared expert does not take"
    if dense.producer.attrs["activation"] != node.attrs["activation"]:
        return "the shared expert's activation differs from the routed experts'"
    if not _same_tokens(x, xs) or (xg is not None and not _same_tokens(x, xg)):
        return "the shared expert does not run on the routed experts' tokens"
    if view is None and xs is not x or view is not None and not same_shape(view, xs):
        return "the shared expert's output is not shaped as the routed experts' sum"
    return None


def _rewrite(op, x, logits, w1, w2, b1, b2, sb, sg, su, sd, routed, gate=None, shape=None, **_):
    attrs = {k: v for k, v in routed.producer.attrs.items() if k in get_op("moe").attrs}
    out = op.moe(x, logits, w1, w2, b1, b2, sb, sg, su, sd, gate, **attrs)
    return out if shape is None else op.reshape(out, shape=shape)


SHARED = [rule("moe_shared", _plain, _rewrite, check=_check),
          rule("moe_shared_view", _viewed, _rewrite, check=_check),
          rule("moe_gated_shared", _gated, _rewrite, check=_check)]
