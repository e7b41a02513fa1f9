"""Converters for linear algebra, normalization, embedding, convolution and pooling."""

from __future__ import annotations

import math

import numpy as np

from compiler.ir import DType, Node
from compiler.ir.symbolic import is_static

from .builder import Builder, fill_value
from .convert_elementwise import Converter, in_dtype


def matmul(b: Builder, node: Node, x: list) -> list:
    return [b.op1("MatMul", x)]


def linear(b: Builder, node: Node, x: list) -> list:
    """Gemm with transB on a 2-D view of x: the weight stays in torch's [out, in] layout.

    Gemm reads B transposed in place (and prepacks it once), so no transposed copy of the weight
    is ever made, at load time or in the artifact. Leading dims are flattened and restored with
    free Reshapes.
    """
    src = node.inputs[0].type
    if src.rank == 2:
        return [b.op1("Gemm", x, transB=1)]
    flat = b.op1("Reshape", [x[0], b.ints([-1, src.shape[-1]])])
    out = b.op1("Gemm", [flat, *x[1:]], transB=1)
    out_shape = list(node.outputs[0].type.shape)
    return [b.op1("Reshape", [out, b.dims(out_shape)])]


def linear_fused_matmul(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.FusedMatMul with transB on x of any rank: no reshapes around the product.

    ORT prepacks the [out, in] weight once at load time, as it does for Gemm.
    """
    out = b.op1("FusedMatMul", x[:2], domain="com.microsoft", transB=1)
    return [out if x[2] is None else b.op1("Add", [out, x[2]])]


def _norm_axis(node: Node) -> int:
    return -len(node.attrs["normalized_shape"])


def _ones(b: Builder, node: Node, shape, value: float = 1.0) -> str:
    """A constant-of-shape fill standing in for an absent affine weight (or bias)."""
    if all(is_static(d) for d in shape):
        return b.const(np.full([int(d) for d in shape], value), in_dtype(node))
    return b.op1("ConstantOfShape", [b.dims(list(shape))], value=fill_value(value, in_dtype(node)))


def layer_norm(b: Builder, node: Node, x: list) -> list:
    scale = x[1] if x[1] is not None else _ones(b, node, node.attrs["normalized_shape"])
    return [b.op1("LayerNormalization", [x[0], scale, x[2]], axis=_norm_axis(node),
                  epsilon=float(node.attrs["eps"]))]


def rms_norm_eps(node: Node) -> float:
    eps = node.attrs["eps"]
    return float(np.finfo(in_dtype(node).to_numpy()).eps) if eps is None else float(eps)


def rms_norm(b: Builder, node: Node, x: list) -> list:
    """x / sqrt(mean(x^2) + eps) * w, in exactly the form ORT's SimplifiedLayerNormFusion matches.

    ORT's fused kernel (SimplifiedLayerNormalization) is registered in the ONNX domain but is not
    an ONNX op, so emitting it directly fails `onnx.checker`; emitting this pattern lets ORT's
    optimizer substitute the kernel at load time while the model stays standard ONNX.
    """
    dtype = in_dtype(node)
    axes = b.ints(list(range(_norm_axis(node), 0)))
    mean = b.op1("ReduceMean", [b.op1("Pow", [x[0], b.const(2.0, dtype)]), axes], keepdims=1)
    root = b.op1("Sqrt", [b.op1("Add", [mean, b.const(rms_norm_eps(node), dtype)])])
    out = b.op1("Div", [x[0], root])
    return [out if x[1] is None else b.op1("Mul", [out, x[1]])]


def group_norm(b: Builder, node: Node, x: list) -> list:
    """Normalize [N, G, rest] over its last axis, then the per-channel affine in [C, 1, ...]."""
    src, dtype = node.inputs[0].type, in_dtype(node)
    groups = int(node.attrs["groups"])
    grouped = b.op1("Reshape", [x[0], b.ints([0, groups, -1])])
    axes = b.ints([2])
    mean = b.op1("ReduceMean", [grouped, axes], keepdims=1)
    diff = b.op1("Sub", [grouped, mean])
    var = b.op1("ReduceMean", [b.op1("Mul", [diff, diff]), axes], keepdims=1)
    std = b.op1("Sqrt", [b.op1("Add", [var, b.const(float(node.attrs["eps"]), dtype)])])
    out = b.op1("Reshape", [b.op1("Div", [diff, std]), b.op1("Shape", [x[0]])])
    per_channel = b.ints([-1] + [1] * (src.rank - 2))
    if x[1] is not None:
        out = b.op1("Mul", [out, b.op1("Reshape", [x[1], per_channel])])
    if x[2] is not None:
        out = b.op1("Add", [out, b.op1("Reshape", [x[2], per_channel])])
    return [out]


def batch_norm(b: Builder, node: Node, x: list) -> list:
    channels = node.inputs[3].type.shape
    scale = x[1] if x[1] is not None else _ones(b, node, channels)
    bias = x[2] if x[2] is not None else _ones(b, node, channels, 0.0)
    return [b.op1("BatchNormalization", [x[0], scale, bias, x[3], x[4]],
                  epsilon=float(node.attrs["eps"]))]


def embedding(b: Builder, node: Node, x: list) -> list:
    idx = x[1]
    if node.inputs[1].type.dtype not in (DType.i64, DType.i32):
        idx = b.op1("Cast", [idx], to=7)
    return [b.op1("Gather", [x[0], idx], axis=0)]


def _pads(padding) -> list[int]:
    return list(padding) + list(padding)


def conv(b: Builder, node: Node, x: list) -> list:
    a = node.attrs
    return [b.op1("Conv", x, strides=list(a["stride"]), pads=_pads(a["padding"]),
                  dilations=list(a["dilation"]), group=int(a["groups"]))]


def max_pool(b: Builder, node: Node, x: list) -> list:
    a = node.attrs
    return [b.op1("MaxPool", x, kernel_shape=list(a["kernel"]), strides=list(a["stride"]),
                  pads=_pads(a["padding"]), dilations=list(a["dilation"]),
                  ceil_mode=int(a["ceil_mode"]))]


def avg_pool(b: Builder, node: Node, x: list) -> list:
    """AveragePool; with divisor_override, window sums from a depthwise all-ones Conv instead."""
    a = node.attrs
    if a["divisor_override"] is None:
        return [b.op1("AveragePool", x, kernel_shape=list(a["kernel"]),
                      strides=list(a["stride"]), pads=_pads(a["padding"]),
                      ceil_mode=int(a["ceil_mode"]),
                      count_include_pad=int(a["count_include_pad"]))]
    channels = int(node.inputs[0].type.shape[1])
    ones = b.const(np.ones([channels, 1, *a["kernel"]]), in_dtype(node))
    sums = b.op1("Conv", [x[0], ones], strides=list(a["stride"]), pads=_pads(a["padding"]),
                 group=channels)
    return [b.op1("Div", [sums, b.const(float(a["divisor_override"]), in_dtype(node))])]


def adaptive_avg_pool(b: Builder, node: Node, x: list) -> list:
    """torch's adaptive windows: [floor(i*in/out), ceil((i+1)*in/out)) along each pooled axis.

    Output size 1 is a global mean; evenly dividing sizes are a plain AveragePool; other sizes
    are built window by window (they need static input sizes, see `limits`).
    """
    src = node.inputs[0].type
    out_size = list(node.attrs["output_size"])
    axes = list(range(src.rank - len(out_size), src.rank))
    if all(o == 1 for o in out_size):
        return [b.op1("ReduceMean", [x[0], b.ints(axes)], keepdims=1)]
    sizes = [src.shape[a] for a in axes]
    if all(isinstance(s, int) and s % o == 0 for s, o in zip(sizes, out_size)):
        kernel = [s // o for s, o in zip(sizes, out_size)]
        return [b.op1("AveragePool", x, kernel_shape=kernel, strides=kernel)]
    out = x[0]
    for axis, size, o in zip(axes, sizes, out_size):
        windows = [b.op1("ReduceMean", [b.op1("Slice", [
            out, b.ints([(i * size) // o]), b.ints([math.ceil((i + 1) * size / o)]),
            b.ints([axis])]), b.ints([axis])], keepdims=1) for i in range(o)]
        out = b.op1("Concat", windows, axis=axis)
    return [out]


def table() -> dict[str, Converter]:
    return {"matmul": matmul, "linear": linear, "layer_norm": layer_norm, "rms_norm": rms_norm,
            "group_norm": group_norm, "batch_norm": batch_norm, "embedding": embedding,
            "conv": conv, "max_pool": max_pool, "avg_pool": avg_pool,
            "adaptive_avg_pool": adaptive_avg_pool}
