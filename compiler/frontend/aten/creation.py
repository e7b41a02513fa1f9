"""Tensor creation: full/zeros/ones and their `_like`/`new_` forms, scalar_tensor, arange.

Shapes come from the result torch computed (symbolic where sizes are), dtypes from the result's
dtype, so default-dtype rules (`torch.full((2,), 1)` is int64) need no re-deriving here.
`empty` has undefined contents, so filling it with zeros is a valid lowering.
"""

from __future__ import annotations

from ..emitter import AtenEmitter, scalar_value
from .table import converts


def _full(em: AtenEmitter, value):
    dtype = em.out_dtype()
    return em.op("full", shape=em.out_shape(), value=scalar_value(value, dtype), dtype=dtype)


def _filled(value=None, arg: str = "fill_value"):
    """Converter for a creation op whose fill is `value`, or the argument `arg` when None."""
    def convert(em: AtenEmitter, a):
        return _full(em, a[arg] if value is None else value)
    return convert


for _name in ("full.default", "full_like.default", "new_full.default"):
    converts(_name, ir="full")(_filled())
for _name in ("zeros.default", "zeros_like.default", "new_zeros.default", "empty.memory_format",
              "empty_like.default", "new_empty.default", "empty_strided.default",
              "new_empty_strided.default"):
    converts(_name, ir="full")(_filled(0))
for _name in ("ones.default", "ones_like.default", "new_ones.default"):
    converts(_name, ir="full")(_filled(1))
converts("fill.Scalar", ir="full")(_filled(arg="value"))


@converts("fill.Tensor", ir="cast, expand")
def _fill_tensor(em: AtenEmitter, a):
    value = em.cast(a["value"], em.out_dtype())
    return em.op("expand", value, shape=em.out_shape())


@converts("scalar_tensor.default", ir="constant")
def _scalar_tensor(em: AtenEmitter, a):
    return em.const(a["s"], em.out_dtype())


@converts("arange.default", "arange.start", "arange.start_step", ir="arange")
def _arange(em: AtenEmitter, a):
    # ints stay ints even for a float dtype, so symbolic lengths stay exact (ceiling(s0), not
    # ceiling(1.0*s0)); the values are the same either way.
    return em.op("arange", start=a.get("start", 0), end=a["end"], step=a.get("step", 1),
                 dtype=em.out_dtype())
