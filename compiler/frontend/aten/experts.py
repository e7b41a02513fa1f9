"""transformers' expert kernels as exported: `transformers.grouped_mm_fallback` (the custom op
its default `grouped_mm` expert path calls on CPU, opaque to torch.export) becomes the IR's
`grouped_matmul`, whose semantics are that op's: row block g of the input (rows offs[g-1] up to
offs[g], sorted by expert) times weight[g]; rows from offs[-1] on are zero. dayzero's own
`dayzero::grouped_mm` (the rewrite of expert loops over `split(counts.tolist())`, see
compiler/frontend/ragged_experts.py) means the same and converts the same way."""

from __future__ import annotations

from ..emitter import AtenEmitter, Unsupported
from .table import CONVERTERS, TARGETS


def _grouped_mm(em: AtenEmitter, a):
    x, weight, offsets = a["input"], a["weight"], a["offs"]
    if x.type.rank != 2 or weight.type.rank != 3:
        raise Unsupported(f"grouped_mm_fallback of {x.type} and {weight.type} (expects 2-d input "
                          "and 3-d weight)")
    return em.op("grouped_matmul", em.cast(x, weight.dtype), weight, offsets)


# not an ATen overload: registered under its full name (what fx_to_ir looks converters up by)
# dayzero.grouped_mm: what compiler/frontend/ragged_experts.py makes of split-by-counts loops
for _name in ("transformers.grouped_mm_fallback.default", "dayzero.grouped_mm.default"):
    CONVERTERS[_name] = _grouped_mm
    TARGETS[_name] = "grouped_matmul"
