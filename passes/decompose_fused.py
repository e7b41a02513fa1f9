"""decompose_fused: lower fused ops to the primitive ops they are defined by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from compiler.ir import Graph, get_op

from .base import Pass, PassResult
from .fusion.decompose import decompose_nodes
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class DecomposeFused(Pass):
    """Replace fused ops by their decompositions (compiler/ir/ops/fused.py).

    Needs: a valid graph. `ops=fused` decomposes the ops the fusion passes add (kind `fused`:
    rotary_embedding, gated_mlp, add_rms_norm, add_layer_norm, fused_linear); `ops=all` also
    the model-level ops that have a decomposition (rms_norm, layer_norm, gelu, silu,
    scaled_dot_product_attention), down to elementwise, reduction and matmul ops.
    Guarantees: the graph computes the same values; decomposed nodes keep the loc and the
    `origin` of the node they replace; no node of the selected ops remains.
    Why: a backend without a kernel for a fused op runs its decomposition; and `fuse` followed by
    `decompose_fused{ops=all}` is the unfused graph, to check that fusion changed nothing.
    """

    name: ClassVar[str] = "decompose_fused"
    summary: ClassVar[str] = "lower fused ops to the primitive ops that define them"

    ops: Literal["fused", "all"] = "fused"

    def run(self, graph: Graph) -> PassResult:
        if self.ops == "all":
            records = decompose_nodes(graph, lambda node: True)
        else:
            records = decompose_nodes(graph, lambda node: get_op(node.op).kind == "fused")
        return PassResult(graph, bool(records))
