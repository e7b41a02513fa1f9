"""masked_scatter and scatter: data-dependent writes, in standard ONNX ops.

`scatter` is ScatterElements (opset 18 has every reduction the IR's op names); a 0-d operand
is taken as one element, since ONNX wants rank >= 1.

ONNX has no masked scatter. With the target and the mask broadcast together and flattened, each
masked position takes the source element whose index is the number of masked positions before
it: `CumSum(mask) - 1` indexes the flattened source (`Gather`), `Where` keeps the target elsewhere.
Indices of unmasked positions are clamped into range; their gathered values are discarded.
"""

from __future__ import annotations

from compiler.ir import DType, Node

from .builder import ONNX_DTYPES, Builder
from .convert_elementwise import Converter


def masked_scatter(b: Builder, node: Node, x: list) -> list:
    target, mask, source = x
    target = b.op1("Expand", [target, b.op1("Shape", [mask])])  # torch broadcasts both ways
    shape = b.op1("Shape", [target])
    flat = b.ints([-1])
    mask = b.op1("Reshape", [b.op1("Expand", [mask, shape]), flat])
    count = b.op1("CumSum", [b.op1("Cast", [mask], to=ONNX_DTYPES[DType.i64]),
                             b.const(0, DType.i64)])
    last = b.op1("Sub", [b.op1("Size", [source]), b.const(1, DType.i64)])
    index = b.op1("Min", [b.op1("Max", [b.op1("Sub", [count, b.const(1, DType.i64)]),
                                         b.const(0, DType.i64)]), last])
    picked = b.op1("Gather", [b.op1("Reshape", [source, flat]), index], axis=0)
    merged = b.op1("Where", [mask, picked, b.op1("Reshape", [target, flat])])
    return [b.op1("Reshape", [merged, shape])]


_REDUCTIONS = {"none": "none", "sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


def scatter(b: Builder, node: Node, x: list) -> list:
    target, index, src = x
    rank = node.inputs[0].type.rank
    if rank == 0:
        one = b.ints([0])
        target, index, src = (b.op1("Unsqueeze", [t, one]) for t in (target, index, src))
    if node.inputs[1].dtype != DType.i64:
        index = b.op1("Cast", [index], to=ONNX_DTYPES[DType.i64])
    out = b.op1("ScatterElements", [target, index, src], axis=node.attrs["dim"] % max(rank, 1),
                reduction=_REDUCTIONS[node.attrs["reduce"]])
    return [b.op1("Squeeze", [out, b.ints([0])]) if rank == 0 else out]


def table() -> dict[str, Converter]:
    return {"masked_scatter": masked_scatter, "scatter": scatter}
