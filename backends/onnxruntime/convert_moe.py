"""The fused `moe` op on com.microsoft.MoE: ONNX Runtime's routed expert kernel, which computes
only each token's top-k experts.

The kernel routes by a softmax over router logits, then the top k. Its CPU kernel takes SwiGLU
experts with
interleaved gate/up rows (swiglu_fusion=1): `gate * sigmoid(alpha * gate) * (up + beta)`, with
alpha 1 and beta 0 exactly silu(gate) * up, and no clamp (swiglu_limit infinite). The weights
are the IR's in_out stacks, rearranged by Reshape/Transpose on the initializers, which ONNX
Runtime folds when the session loads.

The kernel's own routing is not used: it ignores a NaN logit where eager returns NaN, and it
knows neither sigmoid scores, DeepSeek's score bias and group-limited choice, a scale nor a
normalisation epsilon. The routing weights w [tokens, k] and expert ids are computed in standard
ops (the op's own `route`, cheap: [tokens, experts]), and the kernel gets the logits log(w) at
the chosen experts and -inf elsewhere. Its softmax over those is w / sum(w) on exactly the
chosen experts, so its output times sum(w) (times the scale) is the routed sum. A weight of 0
enters as the smallest normal float (its expert's share is then below float resolution, and a
token whose weights are all 0 gets sum(w) = 0, a zero output as in eager). The shared expert
is a dense gated MLP beside the kernel (lowered as `gated_mlp`), added to its output: every
token runs it, so there is nothing to route. Other activations run the op's decomposition.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import DType, Graph, Node, get_op
from compiler.ir.ops.fused import Emitter
from compiler.ir.ops.moe import padded, route, shared_expert

from .builder import Builder
from .convert_elementwise import in_dtype

MS = "com.microsoft"


def moe_fits(node: Node) -> str | None:
    if in_dtype(node).value != "f32":
        return "com.microsoft.MoE's CPU kernel is float32 only"
    if node.attrs["activation"] != "silu":
        return "com.microsoft.MoE's CPU kernel runs SwiGLU experts only"
    return None


def _interleaved(b: Builder, name: str, experts: int, inter: int, lead: list[int]) -> str:
    """[..., 2 * inter] (gate columns, then up) -> rows gate0, up0, gate1, up1, ..., moved to
    the front of the trailing dims: the out_in, interleaved layout MoE's fc1 takes."""
    split = b.op1("Reshape", [name, b.ints([experts, *lead, 2, inter])])
    perm = [0, 2 + len(lead), 1 + len(lead), *range(1, 1 + len(lead))]
    return b.op1("Reshape", [b.op1("Transpose", [split], perm=perm),
                             b.ints([experts, 2 * inter, *lead])])


def moe(b: Builder, node: Node, x: list) -> list:
    """The routing and the shared expert in IR ops around a kernel-routed `moe`, lowered node by
    node."""
    from .op_table import lower_node  # the table this converter is an entry of

    inputs = padded(list(node.inputs))
    attrs = get_op("moe").complete_attrs({k: v for k, v in node.attrs.items()
                                          if k in get_op("moe").attrs})
    e = Emitter(Graph("moe_on_kernel"))
    xv, logits = inputs[0], inputs[1]
    weights, ids = route(e, logits, inputs[6], {**attrs, "scale": 1.0})
    tiny = e.const(float(np.finfo(np.float32).tiny), DType.f32)
    empty = e.op("full", shape=list(logits.shape), value=float("-inf"), dtype=DType.f32)
    logits = e.op("scatter", empty, ids, e.op("log", e.op("maximum", weights, tiny)), dim=1)
    total = e.op("sum", weights, dims=[-1], keepdim=True)
    if attrs["scale"] != 1.0:
        total = e.op("mul", total, e.const(attrs["scale"], DType.f32))
    out = e.op("mul", e.op("moe", xv, logits, *inputs[2:6], None, top_k=attrs["top_k"],
                           activation=attrs["activation"]), total)
    shared = shared_expert(e, xv, inputs[7:], attrs["activation"])
    if shared is not None:
        out = e.op("add", out, shared)
    env = {id(v): name for v, name in zip(inputs, padded(list(x))) if v is not None}
    for inner in e.created:
        outs = (_routed(b, inner, [None if v is None else env[id(v)] for v in inner.inputs])
                if inner.op == "moe" else
                lower_node(b, inner, [None if v is None else env[id(v)] for v in inner.inputs])[0])
        env.update((id(v), name) for v, name in zip(inner.outputs, outs))
    return [env[id(out)]]


def _routed(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.MoE on routing logits that are log(w) at the chosen experts."""
    experts, hidden, two_inter = node.inputs[2].type.shape
    inter = two_inter // 2
    fc1 = _interleaved(b, x[2], experts, inter, [hidden])
    fc1_bias = None if x[4] is None else _interleaved(b, x[4], experts, inter, [])
    fc2 = b.op1("Transpose", [x[3]], perm=[0, 2, 1])
    return [b.op1("MoE", [x[0], x[1], fc1, fc1_bias, fc2, x[5]], domain=MS,
                  k=int(node.attrs["top_k"]),
                  activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0,
                  activation_beta=0.0, swiglu_limit=float("inf"),
                  normalize_routing_weights=0)]
