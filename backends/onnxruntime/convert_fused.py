"""Fused IR ops (rotary_embedding, fused_linear, gated_mlp, add_rms_norm, add_layer_norm) and the
communication ops.

A fused op is defined by its decomposition (`compiler.ir.ops.fused.DECOMPOSITIONS`); where ONNX
Runtime has no single kernel for it, the decomposition's nodes are lowered one by one through the
same table (so a gelu epilogue still gets ORT's Gelu kernel). Residual add + norm pairs do have
kernels, SkipSimplifiedLayerNormalization and SkipLayerNormalization, chosen in `fused`.

Communication ops are the identity within one process (a single rank, or the global form before
partitioning); transfers between ranks are the distributed runtime's, so `op_table.LIMITS` refuses
them here.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import Graph, Node
from compiler.ir.ops.fused import Emitter, decompose_into

from .builder import ONNX_DTYPES, Builder
from .convert_elementwise import Converter, in_dtype
from .convert_nn import rms_norm_eps


def decomposed(b: Builder, node: Node, x: list) -> list:
    """Lower the op's decomposition node by node, in a scratch graph over the same values."""
    from .op_table import lower_node  # the table this converter is an entry of

    emitter = Emitter(Graph(f"decomposed_{node.op}"))
    results = decompose_into(emitter, node)
    env = {id(v): name for v, name in zip(node.inputs, x) if v is not None}
    for inner in emitter.created:
        ins = [None if v is None else env[id(v)] for v in inner.inputs]
        outs, _ = lower_node(b, inner, ins)
        env.update((id(v), name) for v, name in zip(inner.outputs, outs))
    return [env[id(v)] for v in results]


def skip_norm_fits(node: Node) -> str | None:
    x = node.inputs[0].type
    if x.rank not in (2, 3):
        return "ORT's skip-norm kernels take [tokens, hidden] or [batch, seq, hidden]"
    if len(node.attrs["normalized_shape"]) != 1:
        return "normalizes over more than the last dim"
    return None


def _gamma(b: Builder, node: Node, name: str | None) -> str:
    if name is not None:
        return name
    size = int(node.attrs["normalized_shape"][0])
    return b.const(np.ones(size), in_dtype(node))


def add_rms_norm(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.SkipSimplifiedLayerNormalization: outputs 0 (norm) and 3 (x + residual)."""
    outs = b.op("SkipSimplifiedLayerNormalization", [x[0], x[1], _gamma(b, node, x[2])], 4,
                domain="com.microsoft", unused=(1, 2), epsilon=rms_norm_eps(node))
    return [outs[0], outs[3]]


def add_layer_norm(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.SkipLayerNormalization: outputs 0 (norm) and 3 (x + residual)."""
    outs = b.op("SkipLayerNormalization", [x[0], x[1], _gamma(b, node, x[2]), x[3]], 4,
                domain="com.microsoft", unused=(1, 2), epsilon=float(node.attrs["eps"]))
    return [outs[0], outs[3]]


def matmul_nbits(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.MatMulNBits on the stored codes and scales (the IR op keeps its layout);
    the zero point is its default, 2^(bits-1): symmetric quantization. int8 activations are
    its accuracy_level 4 (inputs quantized per block, int8 dot products)."""
    a = node.attrs
    n = node.inputs[1].type.shape[0]
    level = {"int8": {"accuracy_level": 4}}.get(a.get("activations", "float"), {})
    scales = x[2]
    if node.inputs[2].type.dtype != in_dtype(node):  # float16 scales: cast, folded at load
        scales = b.op1("Cast", [scales], to=ONNX_DTYPES[in_dtype(node)])
    out = b.op1("MatMulNBits", [x[0], x[1], scales], domain="com.microsoft",
                K=int(a["in_features"]), N=int(n), bits=int(a["bits"]),
                block_size=int(a["group_size"]), **level)
    return [out if x[3] is None else b.op1("Add", [out, x[3]])]


def identity(b: Builder, node: Node, x: list) -> list:
    return [b.op1("Identity", [x[0]])]


def table() -> dict[str, Converter]:
    from compiler.ir.ops.collective import COMMUNICATION_OPS
    from compiler.ir.ops.fused import DECOMPOSITIONS

    entries: dict[str, Converter] = {name: decomposed for name in DECOMPOSITIONS}
    entries.update({name: identity for name in COMMUNICATION_OPS | {"shard"}})
    return entries
