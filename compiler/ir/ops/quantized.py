"""quantized_linear: a linear layer whose weight is stored as blockwise int4/int8 codes.

The layout is ONNX Runtime's MatMulNBits layout, so the onnxruntime backend hands the stored
tensors to that kernel as they are: `qweight` u8 [N, K / group_size, group_size * bits / 8]
(for 4 bits, two codes per byte, the first in the low nibble), `scales` [N * K / group_size]
in x's dtype or float16 (quantize_weights stores a float32 model's scales as float16, which
MatMulNBits gets cast back at load time); symmetric quantization, the zero point is
2^(bits-1). The weight it stands for is `(code - 2^(bits-1)) * scale` per block of
`group_size` input features.

Its meaning is its decomposition: unpack the codes, dequantize, `linear`; every backend without
a kernel for it runs that (the reference backend included), so the quantized model is checked
against exactly the dequantized weights.

`activations="int8"` quantizes the input too, per row and block of `group_size` features
(symmetric, scale max |x| / 127, codes rounded to nearest), so that the product runs on int8
dot products (MatMulNBits' accuracy_level 4: several times faster on CPU for decode, the layout
ONNX Runtime GenAI's int4 models use). The decomposition computes the same rounded codes.
"""

from __future__ import annotations

from ..dtypes import DType
from ..symbolic import equal
from . import shape_rules as rules
from .fused import Emitter, _reference, decomposes
from .registry import REQUIRED, ShapeError, define

BITS = (4, 8)
ACTIVATIONS = ("float", "int8")


def _rule(types, attrs):
    x, qweight, scales, bias = types
    bits, group, k = attrs["bits"], attrs["group_size"], attrs["in_features"]
    if bits not in BITS or not isinstance(group, int) or group <= 0 or k % group:
        raise ShapeError(f"quantized_linear: bits {bits} must be one of {BITS} and group_size "
                         f"{group} must divide in_features {k}")
    if qweight.dtype != DType.u8 or qweight.rank != 3:
        raise ShapeError(f"quantized_linear: qweight {qweight} must be u8[N, blocks, bytes]")
    n, blocks, size = qweight.shape
    if blocks != k // group or size != group * bits // 8:
        raise ShapeError(f"quantized_linear: qweight {qweight} does not hold {k} inputs in "
                         f"groups of {group} at {bits} bits")
    if scales.rank != 1 or scales.shape[0] != n * blocks or not scales.dtype.is_float:
        raise ShapeError(f"quantized_linear: scales {scales} must be a float [{n * blocks}]")
    if scales.dtype not in (x.dtype, DType.f16):
        raise ShapeError(f"quantized_linear: scales {scales} must be float16 or x's dtype "
                         f"{x.dtype}")
    if not x.dtype.is_float or x.rank < 1 or not equal(x.shape[-1], k):
        raise ShapeError(f"quantized_linear: x {x} must be float with {k} features")
    if attrs["activations"] not in ACTIVATIONS:
        raise ShapeError(f"quantized_linear: activations {attrs['activations']!r} must be one "
                         f"of {ACTIVATIONS}")
    if bias is not None and (bias.rank != 1 or bias.shape[0] != n):
        raise ShapeError(f"quantized_linear: bias {bias} must be [{n}]")
    rules.same_dtype([x] + ([bias] if bias is not None else []), "quantized_linear")
    return [x.with_shape(x.shape[:-1] + (n,))]


define("quantized_linear", "x qweight scales bias?", _rule, _reference("quantized_linear"),
       "fused", "x @ dequantize(qweight, scales)^T + bias: blockwise symmetric int4/int8 weights "
       "in ONNX Runtime's MatMulNBits layout", bits=REQUIRED, group_size=REQUIRED,
       in_features=REQUIRED, activations="float")


def int8_rows(e: Emitter, x, group: int):
    """x with each row's blocks of `group` features rounded to 255 levels: round(x / s) * s,
    s = max |x| / 127 over the block (0 for an all-zero block)."""
    k = x.shape[-1]
    blocks = e.op("reshape", x, shape=[*x.shape[:-1], k // group, group])
    scale = e.op("div", e.op("amax", e.op("abs", blocks), dims=[-1], keepdim=True),
                 e.const(127.0, x.dtype))
    zero = e.const(0.0, x.dtype)
    inverse = e.op("where", e.op("gt", scale, zero), e.op("reciprocal", scale), zero)
    codes = e.op("round", e.op("mul", blocks, inverse))
    return e.op("reshape", e.op("mul", codes, scale), shape=list(x.shape))


def dequantized(e: Emitter, qweight, scales, bits: int, group: int, dtype: DType):
    """The float weight [..., N, K] that codes qweight [..., N, K / group, group * bits / 8] and
    scales (any shape holding [..., N, K / group] in order) stand for."""
    *lead, blocks, size = qweight.shape
    codes = qweight
    if bits == 4:  # two codes per byte, the first in the low nibble
        sixteen = e.const(16, DType.u8)
        low = e.op("reshape", e.op("remainder", qweight, sixteen), shape=[*lead, blocks, size, 1])
        high = e.op("reshape", e.op("div", qweight, sixteen, rounding_mode="floor"),
                    shape=[*lead, blocks, size, 1])
        codes = e.op("reshape", e.op("concat", low, high, dim=-1), shape=[*lead, blocks, group])
    centered = e.op("sub", e.op("cast", codes, dtype=dtype),
                    e.const(float(2 ** (bits - 1)), dtype))
    if scales.dtype != dtype:  # float16 scales of float32 weights: exact in float32
        scales = e.op("cast", scales, dtype=dtype)
    blockwise = e.op("mul", centered, e.op("reshape", scales, shape=[*lead, blocks, 1]))
    return e.op("reshape", blockwise, shape=[*lead[:-1], lead[-1], blocks * group])


@decomposes("quantized_linear")
def _quantized_linear(e: Emitter, inputs, attrs):
    x, qweight, scales, bias = inputs
    weight = dequantized(e, qweight, scales, attrs["bits"], attrs["group_size"], x.dtype)
    if attrs["activations"] == "int8":
        x = int8_rows(e, x, attrs["group_size"])
    return [e.op("linear", x, weight, bias)]
