"""Reductions, the softmax family, cumsum and topk.

ATen's `dim=None` / `dim=[]` (reduce everything) maps to the IR's `dims=[]`. Where torch reduces in
another dtype (`sum` of bools gives int64, an explicit `dtype=`), the input is cast first.
"""

from __future__ import annotations

from compiler.ir import DType

from ..emitter import AtenEmitter
from .table import converts, register_many


def _dims(dim) -> list:
    if dim is None:
        return []
    return [dim] if isinstance(dim, int) else list(dim)


def _reduce(target: str):
    def convert(em: AtenEmitter, a):
        x = em.cast(a["self"], em.out_dtype())
        return em.op(target, x, dims=_dims(a.get("dim")), keepdim=bool(a.get("keepdim", False)))
    return convert


register_many({
    "sum.dim_IntList": "sum", "sum.default": "sum", "mean.dim": "mean", "mean.default": "mean",
    "amax.default": "amax", "amin.default": "amin", "max.default": "amax", "min.default": "amin",
    "prod.dim_int": "prod", "prod.default": "prod",
}, _reduce)


def _logical(target: str):
    def convert(em: AtenEmitter, a):
        return em.op(target, a["self"], dims=_dims(a.get("dim")),
                     keepdim=bool(a.get("keepdim", False)))
    return convert


register_many({f"{op}.{ov}": op for op in ("any", "all") for ov in ("dims", "dim", "default")},
              _logical)


def _var(em: AtenEmitter, a):
    correction = a.get("correction")
    if "unbiased" in a:
        correction = 1 if a["unbiased"] else 0
    return em.op("var", a["self"], dims=_dims(a["dim"]),
                 correction=1 if correction is None else correction, keepdim=bool(a["keepdim"]))


converts("var.correction", "var.dim", ir="var")(_var)


@converts("std.correction", "std.dim", ir="var, sqrt")
def _std(em: AtenEmitter, a):
    return em.op("sqrt", _var(em, a))


@converts("var_mean.correction", ir="var, mean")
def _var_mean(em: AtenEmitter, a):
    mean = em.op("mean", a["self"], dims=_dims(a["dim"]), keepdim=bool(a["keepdim"]))
    return _var(em, a), mean


def _value_and_index(value_op: str, index_op: str):
    def convert(em: AtenEmitter, a):
        dim, keepdim = a["dim"], bool(a["keepdim"])
        return (em.op(value_op, a["self"], dims=[dim], keepdim=keepdim),
                em.op(index_op, a["self"], dim=dim, keepdim=keepdim))
    return convert


converts("max.dim", ir="amax, argmax")(_value_and_index("amax", "argmax"))
converts("min.dim", ir="amin, argmin")(_value_and_index("amin", "argmin"))


def _arg(target: str):
    def convert(em: AtenEmitter, a):
        return em.op(target, a["self"], dim=a["dim"], keepdim=bool(a["keepdim"]))
    return convert


register_many({"argmax.default": "argmax", "argmin.default": "argmin"}, _arg)


def _softmax(target: str):
    def convert(em: AtenEmitter, a):
        return em.op(target, em.cast(a["self"], em.out_dtype()), dim=a["dim"])
    return convert


register_many({"_softmax.default": "softmax", "softmax.int": "softmax",
               "_log_softmax.default": "log_softmax", "log_softmax.int": "log_softmax"}, _softmax)


@converts("linalg_vector_norm.default", ir="abs, sum, amax, pow, sqrt")
def _vector_norm(em: AtenEmitter, a):
    """The p-norm from reductions: sqrt(sum x^2) for p=2, max |x| for p=inf, and so on."""
    dtype = em.out_dtype()
    x, p = em.cast(a["self"], dtype), float(a["ord"])
    dims, keepdim = _dims(a["dim"]), bool(a["keepdim"])
    if p == 0:
        nonzero = em.op("ne", x, em.const(0, dtype))
        return em.op("sum", em.cast(nonzero, dtype), dims=dims, keepdim=keepdim)
    magnitude = em.op("abs", x)
    if p in (float("inf"), float("-inf")):
        return em.op("amax" if p > 0 else "amin", magnitude, dims=dims, keepdim=keepdim)
    if p == 1:
        return em.op("sum", magnitude, dims=dims, keepdim=keepdim)
    if p == 2:
        squares = em.op("mul", x, x)
        return em.op("sqrt", em.op("sum", squares, dims=dims, keepdim=keepdim))
    powered = em.op("pow", magnitude, em.const(p, dtype))
    total = em.op("sum", powered, dims=dims, keepdim=keepdim)
    return em.op("pow", total, em.const(1.0 / p, dtype))


@converts("cumsum.default", ir="cumsum")
def _cumsum(em: AtenEmitter, a):
    """The IR sums integers in i64 (aten's default); an explicit narrower integer dtype (MoE
    routers count tokens per expert with dtype=torch.int32) sums in i64 and casts after, which
    wraps exactly as torch's int32 sum does: both are the same value modulo 2**32."""
    out = em.out_dtype()
    acc = out if out.is_float else DType.i64
    total = em.op("cumsum", em.cast(a["self"], acc), dim=a["dim"])
    return em.cast(total, out)


@converts("topk.default", ir="topk")
def _topk(em: AtenEmitter, a):
    values, indices = em.ops("topk", a["self"], k=a["k"], dim=a["dim"], largest=bool(a["largest"]),
                             sorted=bool(a["sorted"]))
    return values, indices
