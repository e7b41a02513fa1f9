"""quantize_weights: store every linear layer's weight as blockwise symmetric int4/int8 codes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from compiler.errors import DayzeroError
from compiler.ir import DType, Graph, Node, TensorType
from compiler.ir.weights import is_lazy

from .base import Pass, PassResult
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class QuantizeWeights(Pass):
    """Replace `linear(x, w, b)` with `quantized_linear(x, codes, scales, b)`.

    Each row of w is cut into blocks of `group_size` input features; a block's scale is its
    value of largest magnitude over -2^(bits-1) (negative for a positive extreme), and its
    codes are round(w / scale) clamped to the signed range [-2^(bits-1), 2^(bits-1) - 1] and
    offset by 2^(bits-1) (two 4-bit codes per byte, the first in the low nibble): ONNX
    Runtime's MatMulNBits layout and its own quantizer's rule, so that backend runs the stored
    bytes as they are. The extreme lands exactly on code -2^(bits-1), so all 2^bits codes are
    used (|scale| is max|w| / 8 for int4, against max|w| / 7 for a range of -7..7: about 12%
    less error at the same bytes). The error per weight is at most half a step, |scale| / 2,
    except weights of the extreme's opposite sign beyond (2^(bits-1) - 1/2) steps, which
    clamp to the top code: at most one step. A float32 weight's scales are stored as float16
    (rounded first, the codes rounded against the stored scale), as GGML's and GPTQ's are: a
    tenth fewer bytes at int4 in groups of 32, which a decode step reads every token.
    Needs: weights with data (a streamed checkpoint's are quantized as the artifact writer
    reaches them, one source tensor in memory at a time). A linear
    whose in-features are not a multiple of `group_size`, or whose weight is not a float 2-d
    weight, is left in float.
    Guarantees: the graph computes x @ dequantized(w)^T + b, exactly what the reference backend
    runs (the op's decomposition); the float weights no linear reads any more are dropped.
    Why: 4-bit weights are an eighth of float32's bytes; memory and bandwidth are most of an
    LLM's cost, and MatMulNBits reads the codes directly.
    """

    name: ClassVar[str] = "quantize_weights"
    summary: ClassVar[str] = "blockwise symmetric int4/int8 weights for every linear layer"

    bits: int = 4
    group_size: int = 128
    # int8: the inputs are quantized per block too, for int8 dot products (see
    # compiler/ir/ops/quantized.py)
    activations: Literal["float", "int8"] = "float"

    def __post_init__(self):
        if self.bits not in (4, 8) or self.group_size < 2 or self.group_size % 2:
            raise DayzeroError(f"quantize_weights: bits={self.bits}, group_size="
                               f"{self.group_size}", "pass quantize_weights",
                               "use bits=4 or 8 and an even group_size (e.g. 32, 64, 128)")

    def run(self, graph: Graph) -> PassResult:
        changed = False
        for node in list(graph.nodes):
            if node.op == "linear" and self._fits(graph, node):
                self._replace(graph, node)
                changed = True
        if changed:
            graph.remove_unused_weights()
        return PassResult(graph, changed)

    def _fits(self, graph: Graph, node: Node) -> bool:
        return self.skip_reason(graph, node) is None

    def skip_reason(self, graph: Graph, node: Node) -> str | None:
        """Why this linear stays in float (None: it is quantized)."""
        w = node.inputs[1]
        if not graph.is_weight(w):
            return "weight is computed, not stored"
        if w.type.rank != 2 or not w.dtype.is_float:
            return "weight is not a 2-d float tensor"
        k = w.shape[1]
        if not isinstance(k, int) or k % self.group_size:
            return f"in-features {k} not a multiple of group_size {self.group_size}"
        return None

    def survey(self, graph: Graph) -> str:
        """One line for the compile log: how many linears this pass quantizes, and per reason
        how many it leaves in float (counted with the predicate `run` uses)."""
        reasons: dict[str, int] = {}
        linears = [n for n in graph.nodes if n.op == "linear"]
        widths = []
        for node in linears:
            reason = self.skip_reason(graph, node)
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
                if reason.startswith("in-features") and isinstance(node.inputs[1].shape[1], int):
                    widths.append(node.inputs[1].shape[1])
        done = len(linears) - sum(reasons.values())
        line = (f"quantize_weights: {done} of {len(linears)} linear layers to int{self.bits} "
                f"(group_size {self.group_size})")
        if reasons:
            line += "; left in float: " + "; ".join(
                f"{count} ({reason})" for reason, count in sorted(reasons.items()))
        fit = _group_size_for(widths, self.group_size)
        if fit:
            line += (f"\n  (quantize.group_size {fit[0]} would quantize {fit[1]} of those as "
                     "well; ONNX Runtime's MatMulNBits takes powers of two from 16)")
        return line

    def _replace(self, graph: Graph, node: Node) -> None:
        w = node.inputs[1]
        # a float32 weight's scales are stored as float16 (bf16 and f16 ones keep theirs)
        half = w.dtype == DType.f32
        rule, scale_dtype = (quantize_half_scales, DType.f16) if half else (quantize, w.dtype)
        codes, scales = quantized_weight(graph, w.name, self.bits, self.group_size, rule,
                                         scale_dtype=scale_dtype)
        k = int(w.shape[1])
        qname = unused_weight_name(graph, f"{w.name}.q{self.bits}")
        sname = unused_weight_name(graph, f"{w.name}.scales")
        qweight = graph.add_weight(qname, TensorType(DType.u8, tuple(codes.shape)), codes)
        scale = graph.add_weight(sname, TensorType(scale_dtype, tuple(scales.shape)), scales)
        new = graph.add_node("quantized_linear", [node.inputs[0], qweight, scale, node.inputs[2]],
                             {"bits": self.bits, "group_size": self.group_size,
                              "in_features": k, "activations": self.activations},
                             loc=node.loc, before=node)
        graph.replace_uses(node.output, new.output)
        graph.remove_nodes([node])
        new.output.name = node.output.name  # the value it replaces is gone: dumps read the same


def _group_size_for(widths: list[int], largest: int) -> tuple[int, int] | None:
    """A smaller group size that also quantizes layers of these in-features, and how many:
    the power of two from 16 (MatMulNBits' block sizes) below `largest` fitting the most."""
    best = None
    size = 16
    while size < largest:
        count = sum(1 for w in widths if w % size == 0)
        if count and (best is None or count >= best[1]):
            best = (size, count)
        size *= 2
    return best


@dataclass(frozen=True)
class BlockRule:
    """quantize_weights' rule, split so that a weight streamed from a checkpoint is quantized
    a slice at a time (see compiler/checkpoint/lazy_quantized.py).

    Each unit (a row of a [N, K] weight; with `stacked`, an expert [K, N] of an in_out stack,
    quantized along K) is quantized on its own: a slice of whole units gives exactly the
    codes and scales the whole tensor gives there, so the writer never needs the source
    whole, nor its codes. `scales` and `codes` are the two halves (codes are rounded against
    the float32 scales `scales` returns: the stored ones for `scale_dtype` float16); calling
    the rule runs both on a tensor in memory.
    """

    scale_dtype: str | None = None  # the stored scales' torch dtype; None: the weight's
    stacked: bool = False

    def __call__(self, weight: Any, bits: int, group_size: int) -> tuple[Any, Any]:
        """(codes, scales) of a whole tensor: [N, K / group_size, group_size * bits / 8] and
        [N * K / group_size] (stacked: [E, N, K / group_size, ...] and [E, N, K / group_size])."""
        import torch

        w = torch.as_tensor(weight)
        scales = self.scales(w, bits, group_size)
        codes = self.codes(w, scales, bits, group_size)
        if self.stacked:
            experts, k, n = w.shape
            return (codes.reshape(experts, n, k // group_size, -1),
                    self.stored(scales, w.dtype).reshape(experts, n, k // group_size))
        n, k = w.shape
        return codes.reshape(n, k // group_size, -1), self.stored(scales, w.dtype)

    def unit(self, shape: tuple[int, ...]) -> int:
        """Elements quantized independently of the rest: a row, or one expert."""
        return math.prod(shape[1:])

    def stored(self, scales: Any, weight_dtype: Any) -> Any:
        """The float32 scales (`scales`' result) as stored: float16, or the weight's dtype."""
        import torch

        return scales.to(getattr(torch, self.scale_dtype) if self.scale_dtype else weight_dtype)

    def scales(self, weight: Any, bits: int, group_size: int) -> Any:
        """Float32 scales of whole units, flat: each block's signed value of largest magnitude
        over -2^(bits-1) (NaN, if any: the scale then is NaN), 1 for an all-zero block."""
        import torch

        blocks = self._rows(weight).reshape(-1, group_size)
        extreme = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True))[:, 0]
        scale = extreme / -(2 ** (bits - 1))
        scale = torch.where(scale != 0, scale, torch.ones_like(scale))
        if self.scale_dtype is not None:
            scale = _stored(scale, getattr(torch, self.scale_dtype))
        return scale

    def codes(self, weight: Any, scales: Any, bits: int, group_size: int) -> Any:
        """u8 codes of whole units, flat, rounded against `scales` (`scales`' result for them):
        round(w / scale) clamped to [-2^(bits-1), 2^(bits-1) - 1], offset by 2^(bits-1), two
        4-bit codes a byte (the first in the low nibble). In place on one float32 copy."""
        import torch

        half = 2 ** (bits - 1)
        blocks = self._rows(weight).reshape(-1, group_size)
        q = blocks / scales.reshape(-1, 1)
        q.round_().clamp_(-half, half - 1).add_(half)
        codes = q.to(torch.uint8)
        if bits == 4:
            codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
        return codes.reshape(-1)

    def _rows(self, weight: Any) -> Any:
        """Float32 rows to quantize along (an expert [K, N] transposed to [N, K])."""
        import torch

        w = torch.as_tensor(weight).float()
        if self.stacked:
            w = w.transpose(-2, -1).contiguous()
        return w


# codes and scales in the weight's dtype
quantize = BlockRule()
# `quantize` with float16 scales: each scale rounded to float16 first, the codes then rounded
# against the stored scale, so the weights they stand for are exactly what every backend
# computes. 2 bytes a block instead of 4 (a tenth of int4's bytes in groups of 32); the
# rounding moves a scale by at most 2^-11 of itself (above float16's normal minimum, 6.1e-5),
# far inside int4's own step.
quantize_half_scales = BlockRule(scale_dtype="float16")


def _stored(scale: Any, dtype: Any) -> Any:
    """`scale` (float32) rounded to `dtype` and back; one below its smallest step keeps that
    step (rather than 0, which no code could divide by); one beyond its range is an error."""
    import torch

    rounded = scale.to(dtype)
    overflow = torch.isinf(rounded) & torch.isfinite(scale)
    if overflow.any():
        top = float(scale[overflow].abs().max())
        raise DayzeroError(f"a block's largest weight, {top * 8:.4g}, is beyond what "
                           f"{str(dtype).removeprefix('torch.')} scales hold", "quantize.weights",
                           "leave this model's weights in float (no quantize: section)")
    finfo = torch.finfo(dtype)
    smallest = torch.tensor(finfo.tiny * finfo.eps, dtype=dtype)  # its smallest subnormal
    rounded = torch.where(rounded == 0, torch.copysign(smallest, scale.to(dtype)), rounded)
    return rounded.float()


def quantized_weight(graph: Graph, name: str, bits: int, group_size: int,
                     rule: Any = quantize, shapes: tuple | None = None,
                     scale_dtype: DType | None = None) -> tuple[Any, Any]:
    """Codes and scales of weight `name` by `rule` (`quantize` by default; `shapes` and
    `scale_dtype` are its results' where the rule is another, see quantize_lazily): computed
    now for data in memory; for a weight streamed from a checkpoint, two lazy handles that
    quantize it when the artifact writer reaches them (one source tensor in memory at a time)."""
    import numpy as np
    import torch

    data = graph.weight_data.get(name)
    if is_lazy(data):
        return data.quantize_lazily(bits, group_size, rule, shapes, scale_dtype)
    if isinstance(data, (torch.Tensor, np.ndarray)):
        return rule(data, bits, group_size)
    raise DayzeroError(f"weight '{name}' has no data to quantize", f"weight {name}",
                       "quantize a model built with its weights (or a checkpoint)")


def unused_weight_name(graph: Graph, name: str) -> str:
    """`name`, or `name.2`, `name.3`, ...: the first no weight of the graph has."""
    candidate, i = name, 1
    while candidate in graph.weights:
        i += 1
        candidate = f"{name}.{i}"
    return candidate
