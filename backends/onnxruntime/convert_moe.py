"""The fused `moe` op on com.microsoft.MoE, and `quantized_moe` on com.microsoft.QMoE: ONNX
Runtime's routed expert kernels, which compute only each token's top-k experts.

QMoE reads the int4 codes as stored (MatMulNBits' per-matrix layout, block_size = the group
size, zero point 8, accuracy_level 0 for float activations, 4 for the op's int8 ones: the
rounding its decomposition computes);
its fc1 rows are interleaved like MoE's, by Reshape/Transpose on the initializers. Its 8-bit
experts always quantize the activations, so 8-bit `quantized_moe` runs QMoE only with int8
activations (and its decomposition otherwise).

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
from compiler.ir.ops.moe import route, shared_expert

from .builder import Builder
from .convert_elementwise import in_dtype

MS = "com.microsoft"


def moe_fits(node: Node) -> str | None:
    if in_dtype(node).value != "f32":
        return "com.microsoft.MoE's CPU kernel is float32 only"
    if node.attrs["activation"] != "silu":
        return "com.microsoft.MoE's CPU kernel runs SwiGLU experts only"
    return None


def qmoe_fits(node: Node) -> str | None:
    group = node.attrs["group_size"]
    if node.attrs["bits"] != 4 and node.attrs["activations"] != "int8":
        return "com.microsoft.QMoE's CPU kernel has no float-activation 8-bit experts"
    if group < 16 or group & (group - 1):
        return f"com.microsoft.QMoE takes block sizes that are powers of two from 16, not {group}"
    return moe_fits(node)


# where each op keeps its kernel's weight inputs, its score bias and its shared expert
_LAYOUT = {"moe": (slice(2, 6), 6, slice(7, 11)), "quantized_moe": (slice(2, 8), 8, None)}


def _interleaved(b: Builder, name: str, experts: int, inter: int, lead: list[int]) -> str:
    """[..., 2 * inter] (gate columns, then up) -> rows gate0, up0, gate1, up1, ..., moved to
    the front of the trailing dims: the out_in, interleaved layout MoE's fc1 takes."""
    split = b.op1("Reshape", [name, b.ints([experts, *lead, 2, inter])])
    perm = [0, 2 + len(lead), 1 + len(lead), *range(1, 1 + len(lead))]
    return b.op1("Reshape", [b.op1("Transpose", [split], perm=perm),
                             b.ints([experts, 2 * inter, *lead])])


def _interleaved_rows(b: Builder, name: str, experts: int, inter: int, width: int) -> str:
    """[experts, 2 * inter, ...] rows (gate rows, then up rows) -> [experts, 2 * inter, width]
    with rows gate0, up0, gate1, up1, ...: QMoE's fc1 layout for codes and scales."""
    split = b.op1("Reshape", [name, b.ints([experts, 2, inter, width])])
    return b.op1("Reshape", [b.op1("Transpose", [split], perm=[0, 2, 1, 3]),
                             b.ints([experts, 2 * inter, width])])


def moe(b: Builder, node: Node, x: list) -> list:
    """The routing and the shared expert in IR ops around a kernel-routed `moe` or
    `quantized_moe`, lowered node by node."""
    from .op_table import lower_node  # the table this converter is an entry of

    spec = get_op(node.op)
    weights_at, bias_at, shared_at = _LAYOUT[node.op]
    inputs = [*node.inputs, *[None] * (len(spec.inputs) - len(node.inputs))]
    attrs = spec.complete_attrs(dict(node.attrs))
    e = Emitter(Graph("moe_on_kernel"))
    xv, logits = inputs[0], inputs[1]
    weights, ids = route(e, logits, inputs[bias_at], {**attrs, "scale": 1.0})
    tiny = e.const(float(np.finfo(np.float32).tiny), DType.f32)
    empty = e.op("full", shape=list(logits.shape), value=float("-inf"), dtype=DType.f32)
    logits = e.op("scatter", empty, ids, e.op("log", e.op("maximum", weights, tiny)), dim=1)
    total = e.op("sum", weights, dims=[-1], keepdim=True)
    if attrs["scale"] != 1.0:
        total = e.op("mul", total, e.const(attrs["scale"], DType.f32))
    kernel_attrs = {k: attrs[k] for k in ("top_k", "activation", "bits", "group_size",
                                          "activations") if k in attrs}
    out = e.op("mul", e.op(node.op, xv, logits, *inputs[weights_at], None, **kernel_attrs),
               total)
    shared = shared_expert(e, xv, inputs[shared_at], attrs["activation"]) if shared_at else None
    if shared is not None:
        out = e.op("add", out, shared)
    env = {id(v): name for v, name in zip(inputs, [*x, *[None] * len(inputs)]) if v is not None}
    for inner in e.created:
        names = [None if v is None else env[id(v)] for v in inner.inputs]
        outs = (_KERNELS[inner.op](b, inner, names) if inner.op in _KERNELS
                else lower_node(b, inner, names)[0])
        env.update((id(v), name) for v, name in zip(inner.outputs, outs))
    return [env[id(out)]]


def _swiglu_attrs(node: Node) -> dict:
    """The routing and activation attributes MoE and QMoE share: SwiGLU as silu(gate) * up,
    routing weights as the kernel's softmax of the given logits."""
    return dict(k=int(node.attrs["top_k"]), activation_type="swiglu", swiglu_fusion=1,
                activation_alpha=1.0, activation_beta=0.0, swiglu_limit=float("inf"),
                normalize_routing_weights=0)


def _routed(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.MoE on routing logits that are log(w) at the chosen experts."""
    experts, hidden, two_inter = node.inputs[2].type.shape
    inter = two_inter // 2
    fc1 = _interleaved(b, x[2], experts, inter, [hidden])
    fc1_bias = None if x[4] is None else _interleaved(b, x[4], experts, inter, [])
    fc2 = b.op1("Transpose", [x[3]], perm=[0, 2, 1])
    return [b.op1("MoE", [x[0], x[1], fc1, fc1_bias, fc2, x[5]], domain=MS,
                  **_swiglu_attrs(node))]


def _routed_quantized(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.QMoE on the stored codes (MatMulNBits' per-matrix layout, zero point
    2^(bits-1); accuracy_level 0 for float activations, 4 for int8 ones), the same routing
    logits as `_routed`."""
    experts, two_inter, blocks, size = node.inputs[2].type.shape
    hidden, down_blocks = node.inputs[4].type.shape[1:3]
    inter = two_inter // 2
    fc1 = _interleaved_rows(b, x[2], experts, inter, blocks * size)
    fc1_scales = _interleaved_rows(b, x[3], experts, inter, blocks)
    fc1_bias = None if x[6] is None else _interleaved(b, x[6], experts, inter, [])
    fc2 = b.op1("Reshape", [x[4], b.ints([experts, hidden, down_blocks * size])])
    return [b.op1("QMoE", [x[0], x[1], fc1, fc1_scales, fc1_bias, fc2, x[5], x[7]], domain=MS,
                  expert_weight_bits=int(node.attrs["bits"]),
                  block_size=int(node.attrs["group_size"]), weights_prepacked=0,
                  accuracy_level=4 if node.attrs["activations"] == "int8" else 0,
                  **_swiglu_attrs(node))]


_KERNELS = {"moe": _routed, "quantized_moe": _routed_quantized}
