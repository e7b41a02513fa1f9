"""Preferred lowerings onto ONNX Runtime's fused kernels, each with the standard-op fallback.

A table, not a chain of ifs: for an IR op, `VARIANTS` lists lowerings in order of preference.
A variant is used when the node fits it (`fits` returns None; otherwise it says why not) and the
running ONNX Runtime has every kernel it `requires` (see `probe`). When a node fits a variant
but the runtime lacks its kernel (a minimal build, an old version), the lowering warns, naming
the missing op, and moves on to the next variant; the op's standard converter in `op_table` is
the final fallback and always works.

Listed: linear (dayzero's own PackedLinear on a constant float32 weight where its library is
built, read from the artifact in its panel layout, see convert_packed_linear; else FusedMatMul,
no reshapes), gelu (Gelu / FastGelu), silu
(QuickGelu), the residual norms (SkipSimplifiedLayerNormalization / SkipLayerNormalization),
attention (MultiHeadAttention) and the whole attention block with rotary (dayzero's own
CausalAttention where its library is built, else GroupQueryAttention, see convert_heads and
native_ops), int4/int8 weights (dayzero's MatMulInt4 for int4 with int8 activations where its
library is built, read from the artifact in its tile layout, see convert_int4; else
MatMulNBits), mixture-of-experts blocks (MoE: routed
experts only; QMoE for int4 experts). Not listed, and why:
- rms_norm: ORT's SimplifiedLayerNormalization kernel lives in the ONNX domain without being an
  ONNX op, so the checker rejects it; the standard form is emitted in the exact pattern ORT's
  optimizer fuses into that kernel at load time (see convert_nn.rms_norm).
- layer_norm: LayerNormalization is standard ONNX (opset 17) and is always used.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from compiler.ir import DType, Node

from . import convert_heads as heads
from .builder import Builder
from .convert_attention import mha, mha_fits
from .convert_elementwise import Converter, in_dtype
from .convert_fused import add_layer_norm, add_rms_norm, matmul_nbits, skip_norm_fits
from .convert_int4 import CODE_TILES, SCALE_TILES, int4_fits, matmul_int4
from .convert_moe import moe, moe_fits, qmoe_fits
from .convert_nn import linear_fused_matmul
from .convert_packed_linear import PANELS, packed_linear, packed_linear_fits
from .convert_paged import paged_attention, paged_fits
from .native_ops import DOMAIN as NATIVE_DOMAIN
from .probe import KernelSet, OrtKernel

MS = "com.microsoft"


class ContribFallbackWarning(UserWarning):
    """A fused ORT kernel is missing from the running build; standard ops are used instead."""


@dataclass(frozen=True)
class StoredAs:
    """The node's input `input`, when a graph weight, is read by the kernel in layout `layout`
    of backends.base.WEIGHT_LAYOUTS. `params` gives each parameter the layout takes as (name,
    input index, dim): the size of that dim of that input of the node (the scales' layout
    takes the output columns, dim 0 of the codes)."""

    input: int
    layout: str
    params: tuple[tuple[str, int, int], ...] = ()

    def arguments(self, node: Node) -> dict[str, int] | None:
        """The layout's parameters for this node; None when a size is symbolic."""
        sizes = {name: node.inputs[index].type.shape[dim] for name, index, dim in self.params}
        return sizes if all(type(v) is int for v in sizes.values()) else None


@dataclass(frozen=True)
class Variant:
    name: str
    requires: tuple[OrtKernel, ...]
    fits: Callable[[Node], str | None]
    emit: Converter
    # stored weights this kernel reads in another layout, which the artifact stores that way
    # (`lower.derived_weights`)
    layouts: tuple[StoredAs, ...] = ()


def _float32(node: Node) -> str | None:
    return None if in_dtype(node) == DType.f32 else "the contrib kernel is float32 only"


def _gelu_form(form: str) -> Callable[[Node], str | None]:
    def fits(node: Node) -> str | None:
        if node.attrs["approximate"] != form:
            return f"approximate is not {form!r}"
        return _float32(node)
    return fits


def _contrib(op_type: str, **attrs) -> Converter:
    def emit(b: Builder, node: Node, x: list) -> list:
        return [b.op1(op_type, x, domain=MS, **attrs)]
    return emit


def _batched_linear(node: Node) -> str | None:
    if node.inputs[0].type.rank <= 2:
        return "a 2-D input is a plain Gemm"
    return _float32(node)


def _mha_fits(node: Node) -> str | None:
    return mha_fits(node) or _float32(node)


VARIANTS: dict[str, tuple[Variant, ...]] = {
    "linear": (
        Variant("ai.dayzero.PackedLinear", (OrtKernel(NATIVE_DOMAIN, "PackedLinear"),),
                packed_linear_fits, packed_linear, layouts=(StoredAs(1, PANELS),)),
        Variant("com.microsoft.FusedMatMul", (OrtKernel(MS, "FusedMatMul"),), _batched_linear,
                linear_fused_matmul),
    ),
    "gelu": (
        Variant("com.microsoft.Gelu", (OrtKernel(MS, "Gelu"),), _gelu_form("none"),
                _contrib("Gelu")),
        Variant("com.microsoft.FastGelu", (OrtKernel(MS, "FastGelu"),), _gelu_form("tanh"),
                _contrib("FastGelu")),
    ),
    "silu": (
        # QuickGelu computes x * sigmoid(alpha * x): with alpha 1 it is exactly SiLU, in one pass.
        Variant("com.microsoft.QuickGelu", (OrtKernel(MS, "QuickGelu"),), _float32,
                _contrib("QuickGelu", alpha=1.0)),
    ),
    "quick_gelu": (
        Variant("com.microsoft.QuickGelu", (OrtKernel(MS, "QuickGelu"),), _float32,
                lambda b, node, x: [b.op1("QuickGelu", x, domain=MS,
                                          alpha=float(node.attrs["alpha"]))]),
    ),
    "add_rms_norm": (
        Variant("com.microsoft.SkipSimplifiedLayerNormalization",
                (OrtKernel(MS, "SkipSimplifiedLayerNormalization"),),
                lambda node: skip_norm_fits(node) or _float32(node), add_rms_norm),
    ),
    "add_layer_norm": (
        Variant("com.microsoft.SkipLayerNormalization", (OrtKernel(MS, "SkipLayerNormalization"),),
                lambda node: skip_norm_fits(node) or _float32(node), add_layer_norm),
    ),
    "scaled_dot_product_attention": (
        Variant("com.microsoft.MultiHeadAttention", (OrtKernel(MS, "MultiHeadAttention"),),
                _mha_fits, mha),
    ),
    "quantized_linear": (
        Variant("ai.dayzero.MatMulInt4", (OrtKernel(NATIVE_DOMAIN, "MatMulInt4"),), int4_fits,
                matmul_int4, layouts=(StoredAs(1, CODE_TILES),
                                      StoredAs(2, SCALE_TILES, (("rows", 1, 0),)))),
        Variant("com.microsoft.MatMulNBits", (OrtKernel(MS, "MatMulNBits"),), _float32,
                matmul_nbits),
    ),
    "multi_head_attention": (
        Variant("ai.dayzero.CausalAttention", (OrtKernel(NATIVE_DOMAIN, "CausalAttention"),),
                heads.causal_fits, heads.causal_attention),
        Variant("com.microsoft.GroupQueryAttention", (OrtKernel(MS, "GroupQueryAttention"),),
                heads.gqa_fits, heads.gqa),
        Variant("com.microsoft.MultiHeadAttention", (OrtKernel(MS, "MultiHeadAttention"),),
                heads.mha_fits, heads.mha),
    ),
    "moe": (
        Variant("com.microsoft.MoE", (OrtKernel(MS, "MoE"),), moe_fits, moe),
    ),
    "quantized_moe": (
        Variant("com.microsoft.QMoE", (OrtKernel(MS, "QMoE"),), qmoe_fits, moe),
    ),
    "paged_attention": (
        Variant("ai.dayzero.PagedAttention", (OrtKernel(NATIVE_DOMAIN, "PagedAttention"),),
                paged_fits, paged_attention),
    ),
}


def choose(node: Node, kernels: KernelSet) -> Variant | None:
    """The first variant the node fits and the runtime can run; None means standard ops."""
    for variant in VARIANTS.get(node.op, ()):
        if variant.fits(node) is not None:
            continue
        missing = [str(k) for k in variant.requires if not kernels.has(k)]
        if not missing:
            return variant
        why = ("is excluded (exclude_kernels)" if set(missing) <= kernels.excluded
               else "kernel is missing from this onnxruntime")
        warnings.warn(f"{', '.join(missing)} {why}; lowering {node.op} with the next variant "
                      "or standard ONNX ops instead (slower, same results)",
                      ContribFallbackWarning, stacklevel=2)
    return None
