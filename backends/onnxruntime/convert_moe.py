"""The fused `moe` op on com.microsoft.MoE: ONNX Runtime's routed expert kernel, which computes
only each token's top-k experts.

It routes by a softmax over the logits, then the top k, optionally renormalised: the IR's
`softmax_topk` (normalize either way), and `topk_softmax` too (a softmax over the k largest
logits is the renormalised top-k of the full softmax). Its CPU kernel takes SwiGLU experts with
interleaved gate/up rows (swiglu_fusion=1): `gate * sigmoid(alpha * gate) * (up + beta)`, with
alpha 1 and beta 0 exactly silu(gate) * up, and no clamp (swiglu_limit infinite). The weights
are the IR's in_out stacks, rearranged by Reshape/Transpose on the initializers, which ONNX
Runtime folds when the session loads. Other routings (sigmoid, a score bias, a scale) and other
activations run the op's decomposition.
"""

from __future__ import annotations

from compiler.ir import Node

from .builder import Builder
from .convert_elementwise import in_dtype

MS = "com.microsoft"


def moe_fits(node: Node) -> str | None:
    a = node.attrs
    if in_dtype(node).value != "f32":
        return "com.microsoft.MoE's CPU kernel is float32 only"
    if a["routing"] not in ("softmax_topk", "topk_softmax"):
        return f"com.microsoft.MoE routes by softmax, not {a['routing']}"
    if node.inputs[6] is not None or a["scale"] != 1.0 or a["normalize_eps"]:
        return "com.microsoft.MoE has no score bias, routed scale or normalisation epsilon"
    if a["activation"] != "silu":
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
    a = node.attrs
    experts, hidden, two_inter = node.inputs[2].type.shape
    inter = two_inter // 2
    fc1 = _interleaved(b, x[2], experts, inter, [hidden])
    fc1_bias = None if x[4] is None else _interleaved(b, x[4], experts, inter, [])
    fc2 = b.op1("Transpose", [x[3]], perm=[0, 2, 1])
    normalize = int(a["normalize"] or a["routing"] == "topk_softmax")
    return [b.op1("MoE", [x[0], x[1], fc1, fc1_bias, fc2, x[5]], domain=MS, k=int(a["top_k"]),
                  activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0,
                  activation_beta=0.0, swiglu_limit=float("inf"),
                  normalize_routing_weights=normalize)]
