"""The conversion table: one converter per IR op, plus per-node limits and half-precision policy.

`CONVERTERS` has an entry for every op in `compiler.ir.ops.OPS` (a test holds it to that). The
converters themselves live in the `convert_*` modules by op family; `fused` may replace one with
a fused ORT kernel per node. `limit` says, as data the driver and `dayzero coverage` can show,
which attribute combinations this backend cannot express.
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import DType, Node, Value, get_op
from compiler.ir.ops.collective import COMMUNICATION_OPS
from compiler.ir.symbolic import is_static

from . import (
    convert_attention,
    convert_elementwise,
    convert_experts,
    convert_fused,
    convert_nn,
    convert_reduce,
    convert_resize,
    convert_scatter,
    convert_shape,
    fused,
)
from .builder import ONNX_DTYPES, Builder
from .convert_elementwise import Converter

CONVERTERS: dict[str, Converter] = {
    **convert_fused.table(),  # decompositions first: ops with their own converter override them
    **convert_elementwise.table(),
    **convert_reduce.table(),
    **convert_nn.table(),
    **convert_shape.table(),
    **convert_scatter.table(),
    **convert_experts.table(),
    **convert_resize.table(),
    "scaled_dot_product_attention": convert_attention.sdpa,
}

# ORT's CPU provider has few float16/bfloat16 kernels, so ops that compute run in float32
# between casts (torch's CPU kernels upcast half types internally too); ops that only move
# data keep the narrow type.
COMPUTE_KINDS = frozenset({"elementwise", "reduction", "normalization", "matmul", "attention",
                           "convolution", "pooling", "fused"})
UPCAST_ALSO = frozenset({"pad", "repeat", "full"})
NARROW = frozenset({DType.f16, DType.bf16})
# inputs that are stored data a kernel reads in their own type, never computed on in it: they
# neither make a node run in float32 nor get cast (quantized weights' float16 scales, which
# MatMulInt4 reads as they are and the other lowerings cast themselves)
STORED_INPUTS: dict[str, frozenset[int]] = {"quantized_linear": frozenset({2})}


def _symbolic_spatial(node: Node) -> str | None:
    src = node.inputs[0].type
    sizes = src.shape[src.rank - len(node.attrs["output_size"]):]
    even = all(o == 1 for o in node.attrs["output_size"])
    if not even and not all(is_static(d) for d in sizes):
        return "adaptive_avg_pool to sizes other than 1 needs static input sizes"
    return None


def _divisor_override(node: Node) -> str | None:
    if node.attrs["divisor_override"] is None:
        return None
    if node.attrs["ceil_mode"]:
        return "avg_pool with both divisor_override and ceil_mode"
    if not is_static(node.inputs[0].type.shape[1]):
        return "avg_pool with divisor_override needs a static channel count"
    return None


def _attention(node: Node) -> str | None:
    if node.attrs["scale"] is None and not is_static(node.inputs[0].type.shape[-1]):
        return "attention with a symbolic head size and no explicit scale"
    return None


def _collective(node: Node) -> str | None:
    ranks = node.attrs.get("ranks")
    if node.op in ("send", "recv") or (ranks is not None and len(ranks) > 1):
        return (f"{node.op} moves data between ranks, which the distributed runtime does; "
                "ONNX Runtime runs one rank's computation")
    return None


def _index(node: Node) -> str | None:
    if any(v is not None and v.type.dtype == DType.bool for v in node.inputs[1:]):
        return "index with a bool mask (its result size depends on the data)"
    return None


# Per op, a check returning why a node cannot be lowered (None when it can), and its summary.
LIMITS: dict[str, Callable[[Node], str | None]] = {
    "adaptive_avg_pool": _symbolic_spatial,
    "avg_pool": _divisor_override,
    "scaled_dot_product_attention": _attention,
    "index": _index,
    "index_put": convert_experts.index_put_fits,
    **{name: _collective for name in COMMUNICATION_OPS},
}


LIMIT_NOTES: dict[str, str] = {
    "adaptive_avg_pool": "output sizes other than 1 need static input sizes",
    "avg_pool": "divisor_override needs a static channel count and no ceil_mode",
    "scaled_dot_product_attention": "a symbolic head size needs an explicit scale",
    "index": "bool mask indices are not supported (data-dependent result size)",
    "index_put": "indices on the leading axes only (x[i] = v, x[i, j] = v)",
    **{name: "only the single-rank form (a transfer between ranks is the runtime's)"
       for name in COMMUNICATION_OPS},
}


def limit(node: Node) -> str | None:
    """Why this backend cannot run `node` (None when it can)."""
    if node.op not in CONVERTERS:
        return f"no ONNX lowering for op {node.op}"
    check = LIMITS.get(node.op)
    return check(node) if check else None


def lower_node(b: Builder, node: Node, x: list) -> tuple[list, str]:
    """ONNX names of `node`'s outputs, and the lowering used: a fused variant's name,
    "decomposition", or "standard"."""
    variant = fused.choose(node, b.kernels)
    if variant is not None:
        return convert(b, node, x, variant.emit), variant.name
    converter = CONVERTERS[node.op]
    how = "decomposition" if converter is convert_fused.decomposed else "standard"
    return convert(b, node, x, converter), how


def convert(b: Builder, node: Node, x: list, converter: Converter) -> list:
    """Run `converter`, in float32 between casts when the node computes on f16/bf16 values."""
    if not _upcast(node):
        return converter(b, node, x)
    f32 = ONNX_DTYPES[DType.f32]
    stored = STORED_INPUTS.get(node.op, frozenset())
    wide_in = [v if val is None or val.type.dtype not in NARROW or i in stored
               else b.op1("Cast", [v], to=f32) for i, (v, val) in enumerate(zip(x, node.inputs))]
    wide = Node(node.op, [v if i in stored else _widen(v) for i, v in enumerate(node.inputs)],
                _widen_attrs(node), [_widen(v) for v in node.outputs], node.loc)
    outs = converter(b, wide, wide_in)
    return [b.op1("Cast", [name], to=ONNX_DTYPES[val.type.dtype]) if val.type.dtype in NARROW
            else name for name, val in zip(outs, node.outputs)]


def _upcast(node: Node) -> bool:
    if node.op == "cast":
        return False
    kind = get_op(node.op).kind
    if kind not in COMPUTE_KINDS and node.op not in UPCAST_ALSO:
        return False
    stored = STORED_INPUTS.get(node.op, frozenset())
    inputs = [v for i, v in enumerate(node.inputs) if i not in stored]
    return any(v is not None and v.type.dtype in NARROW for v in (*inputs, *node.outputs))


def _widen(value: Value | None) -> Value | None:
    if value is None or value.type.dtype not in NARROW:
        return value
    return Value(value.name, value.type.with_dtype(DType.f32))


def _widen_attrs(node: Node) -> dict:
    attrs = dict(node.attrs)
    if attrs.get("dtype") in NARROW:
        attrs["dtype"] = DType.f32
    return attrs
