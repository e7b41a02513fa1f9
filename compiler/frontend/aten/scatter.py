"""Data-dependent merges with a static result shape (the image-token merge of LLaVA-style
models): masked_scatter."""

from __future__ import annotations

from compiler.ir import DType

from ..emitter import AtenEmitter, Unsupported
from .table import converts


@converts("masked_scatter.default", ir="masked_scatter")
def _masked_scatter(em: AtenEmitter, a):
    mask = a["mask"]
    if mask.dtype != DType.bool:
        raise Unsupported(f"masked_scatter with a {mask.dtype} mask (torch requires bool)")
    dtype = em.out_dtype()
    return em.op("masked_scatter", em.cast(a["self"], dtype), mask, em.cast(a["source"], dtype))
