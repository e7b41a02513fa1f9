"""quantize_experts: store each fused `moe` block's routed experts as blockwise int4/int8 codes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from compiler.ir import DType, Graph, Node, TensorType, get_op
from compiler.ir.ops.fused import Emitter
from compiler.ir.ops.moe import padded, shared_expert
from compiler.ir.ops.quantized_moe import MOE_ATTRS

from .base import Pass, PassResult
from .quantize_weights import (
    BlockRule,
    QuantizeWeights,
    quantized_weight,
    unused_weight_name,
)
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class QuantizeExperts(Pass):
    """Replace `moe` with `quantized_moe` on the same routing, its expert stacks quantized.

    The rule is quantize_weights' (symmetric blocks of `group_size` input features, the extreme
    on code -2^(bits-1)), applied to each expert's gate/up and down matrices in linear layout.
    A shared expert becomes linear layers beside the routed block (the `moe` op's own
    `shared_expert` decomposition), which are quantized as quantize_weights would.
    `activations="int8"` rounds the experts' inputs per row and block for int8 dot products,
    as it does every quantized linear's.
    Needs: fused `moe` ops (run after `fuse`) whose stacks are stored weights. A block whose
    hidden or inner size is not a multiple of `group_size`, whose stacks are computed, or whose
    dtype is not float stays a float `moe`.
    Guarantees: the graph computes `moe` on exactly the dequantized stacks (the op's
    decomposition, which the reference backend runs); the float stacks are dropped.
    Why: the routed experts are nearly all of an MoE model's bytes (Mixtral: 96%), and its
    decode is bandwidth-bound: int4 experts are an eighth of fp32's bytes to read. quantize_weights
    runs before fusion and sees only linear layers; the expert stacks exist as such only after
    the `moe` fusion has gathered them.
    """

    name: ClassVar[str] = "quantize_experts"
    summary: ClassVar[str] = "blockwise symmetric int4/int8 routed experts for every fused moe"

    bits: int = 4
    group_size: int = 128
    activations: Literal["float", "int8"] = "float"

    def __post_init__(self):
        QuantizeWeights(bits=self.bits, group_size=self.group_size)  # same option checks

    def run(self, graph: Graph) -> PassResult:
        blocks = [n for n in graph.nodes if n.op == "moe" and self.skip_reason(graph, n) is None]
        for node in blocks:
            self._replace(graph, node)
        if blocks:
            graph.remove_unused_weights()
        return PassResult(graph, bool(blocks))

    def skip_reason(self, graph: Graph, node: Node) -> str | None:
        """Why this `moe` keeps float experts (None: they are quantized)."""
        stacks = node.inputs[2:4]
        if not all(graph.is_weight(w) for w in stacks):
            return "expert stacks are computed, not stored"
        if not all(w.dtype.is_float for w in stacks):
            return "expert stacks are not float"
        hidden, inner = stacks[0].shape[1], stacks[1].shape[1]
        if any(not isinstance(d, int) or d % self.group_size for d in (hidden, inner)):
            return (f"hidden {hidden} or inner size {inner} not a multiple of group_size "
                    f"{self.group_size}")
        return None

    def _replace(self, graph: Graph, node: Node) -> None:
        inputs = padded(list(node.inputs))
        x = inputs[0]
        e = Emitter(graph, before=node, loc=node.loc)
        stacks = [self._quantized_stack(graph, w) for w in inputs[2:4]]
        attrs = get_op("moe").complete_attrs({k: v for k, v in node.attrs.items()
                                              if k in get_op("moe").attrs})
        out = e.op("quantized_moe", x, inputs[1], *stacks[0], *stacks[1], *inputs[4:7],
                   bits=self.bits, group_size=self.group_size, activations=self.activations,
                   **{k: attrs[k] for k in MOE_ATTRS})
        shared = shared_expert(e, x, inputs[7:], attrs["activation"])
        if shared is not None:
            linears = QuantizeWeights(bits=self.bits, group_size=self.group_size,
                                      activations=self.activations)
            for inner in [n for n in e.created if n.op == "linear"]:
                if linears.skip_reason(graph, inner) is None:
                    linears._replace(graph, inner)
            out = e.op("add", out, shared)
        graph.replace_uses(node.output, out)
        graph.remove_nodes([node])
        out.name = node.output.name  # the value it replaces is gone: dumps read the same

    def _quantized_stack(self, graph: Graph, stack) -> list:
        """Codes and scales weights for an in_out stack [experts, in, out]: each expert's
        [out, in] matrix quantized along `in`. A stack streamed from a checkpoint gets lazy
        handles, quantized when the writer reaches them: the pass reads no checkpoint data,
        and the compile holds one stack's codes at a time, not the whole model's."""
        experts, k, n = stack.shape
        blocks = k // self.group_size
        shapes = ((experts, n, blocks, self.group_size * self.bits // 8), (experts, n, blocks))
        codes, scales = quantized_weight(graph, stack.name, self.bits, self.group_size,
                                   quantize_stack, shapes)
        return [graph.add_weight(unused_weight_name(graph, f"{stack.name}.q{self.bits}"),
                                 TensorType(DType.u8, shapes[0]), codes),
                graph.add_weight(unused_weight_name(graph, f"{stack.name}.scales"),
                                 TensorType(stack.dtype, shapes[1]), scales)]


# quantize_weights' rule on each expert of an in_out stack [experts, in, out]: codes
# [experts, out, in / group_size, bytes] and scales [experts, out, in / group_size], in the
# stack's dtype; a streamed stack is quantized an expert (or a few) at a time
quantize_stack = BlockRule(stacked=True)
