"""masked_scatter: the data-dependent merge of vision-language models, in standard ONNX ops.

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


def table() -> dict[str, Converter]:
    return {"masked_scatter": masked_scatter}
