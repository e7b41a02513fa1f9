"""quantized_moe: a mixture-of-experts block whose routed experts are stored as int4/int8 codes.

It is `moe` (ops/moe.py) with the two expert stacks in `quantized_linear`'s blockwise layout, one
matrix per expert in linear (out_in) layout, quantized along its input features:

- `gate_up_codes` u8 [experts, 2 * inter, hidden / group_size, group_size * bits / 8], gate rows
  first, then up rows; `gate_up_scales` [experts, 2 * inter, hidden / group_size];
- `down_codes` u8 [experts, hidden, inter / group_size, group_size * bits / 8];
  `down_scales` [experts, hidden, inter / group_size].

Symmetric codes with zero point 2^(bits-1), as ONNX Runtime's MatMulNBits and QMoE read them, so
the onnxruntime backend hands the stored bytes to com.microsoft.QMoE (which computes only each
token's chosen experts). There is no shared expert: the pass that makes this op
(passes/quantize_experts.py) writes a `moe`'s shared expert beside it as linear layers, which
quantize like any other.

Its meaning is its decomposition: dequantize both stacks into `moe`'s in_out layout and run
`moe`, so the quantized model is checked against exactly the dequantized weights. With
`activations="int8"` each expert's inputs (the tokens, then the gated hidden) are rounded per
row and block of `group_size` as quantized_linear's are (int8 dot products: QMoE's
accuracy_level 4, several times faster for decode).
"""

from __future__ import annotations

from ..dtypes import DType
from ..types import TensorType
from .fused import Emitter, _reference, decomposes
from .moe import _moe_rule, routed_experts
from .quantized import ACTIVATIONS, BITS, dequantized, int8_rows
from .registry import REQUIRED, ShapeError, define, get_op

INPUTS = ("x logits gate_up_codes gate_up_scales down_codes down_scales b_gate_up? b_down? "
          "score_bias?")
# the routing and expert attributes it shares with `moe` (no shared expert)
MOE_ATTRS = ("top_k", "routing", "normalize", "normalize_eps", "scale", "activation", "n_group",
             "topk_group", "group_top", "group_fill")


def _stack(codes: TensorType, scales: TensorType, name: str, bits: int, group: int,
           dtype: DType) -> TensorType:
    """The float stack [experts, rows, in_features] that codes and scales stand for."""
    if codes.dtype != DType.u8 or codes.rank != 4 or any(not isinstance(d, int)
                                                         for d in codes.shape):
        raise ShapeError(f"quantized_moe: {name}_codes {codes} must be u8[experts, rows, blocks, "
                         "bytes] of static size")
    experts, rows, blocks, size = codes.shape
    if size != group * bits // 8:
        raise ShapeError(f"quantized_moe: {name}_codes {codes} does not hold groups of {group} "
                         f"at {bits} bits ({group * bits // 8} bytes a block)")
    if scales.rank != 3 or tuple(scales.shape) != (experts, rows, blocks) \
            or scales.dtype != dtype:
        raise ShapeError(f"quantized_moe: {name}_scales {scales} must be "
                         f"{dtype}[{experts}, {rows}, {blocks}]")
    return TensorType(dtype, (experts, rows, blocks * group))


def _rule(types, attrs):
    x, logits, gu_codes, gu_scales, down_codes, down_scales, *rest = [*types, None, None, None][:9]
    bits, group = attrs["bits"], attrs["group_size"]
    if bits not in BITS or not isinstance(group, int) or group < 2 or group % 2:
        raise ShapeError(f"quantized_moe: bits {bits} must be one of {BITS} and group_size "
                         f"{group} an even number")
    if attrs["activations"] not in ACTIVATIONS:
        raise ShapeError(f"quantized_moe: activations {attrs['activations']!r} must be one of "
                         f"{ACTIVATIONS}")
    gate_up = _stack(gu_codes, gu_scales, "gate_up", bits, group, x.dtype)
    down = _stack(down_codes, down_scales, "down", bits, group, x.dtype)
    experts, two_inter, hidden = gate_up.shape
    in_out = [TensorType(x.dtype, (experts, hidden, two_inter)),
              TensorType(x.dtype, (experts, down.shape[2], down.shape[1]))]
    return _moe_rule([x, logits, *in_out, *rest], {k: attrs[k] for k in MOE_ATTRS})


define("quantized_moe", INPUTS, _rule, _reference("quantized_moe"), "fused",
       "mixture of experts whose routed expert stacks are blockwise symmetric int4/int8 codes "
       "(quantized_linear's layout per expert): `moe` on the dequantized stacks",
       bits=REQUIRED, group_size=REQUIRED, activations="float", top_k=REQUIRED,
       routing="softmax_topk",
       normalize=False, normalize_eps=0.0, scale=1.0, activation="silu", n_group=1,
       topk_group=1, group_top=1, group_fill=float("-inf"))


@decomposes("quantized_moe")
def _quantized_moe(e: Emitter, inputs, attrs):
    x, logits, gu_codes, gu_scales, down_codes, down_scales, *rest = [*inputs, None, None,
                                                                      None][:9]
    bits, group = attrs["bits"], attrs["group_size"]
    stacks = [e.op("permute", dequantized(e, codes, scales, bits, group, x.dtype), dims=[0, 2, 1])
              for codes, scales in ((gu_codes, gu_scales), (down_codes, down_scales))]
    moe_attrs = {k: attrs[k] for k in MOE_ATTRS}
    if attrs["activations"] == "float":
        return [e.op("moe", x, logits, *stacks, *rest, **moe_attrs)]
    return [routed_experts(e, x, logits, *stacks, *rest, get_op("moe").complete_attrs(moe_attrs),
                           rows=lambda em, v: int8_rows(em, v, group))]
