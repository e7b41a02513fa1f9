"""Reductions and the softmax family. `dims=[]` reduces over every axis."""

from __future__ import annotations

from ..dtypes import DType
from . import shape_rules as rules
from .registry import define


def _torch():
    import torch

    return torch


def _dims(dims):
    return list(dims) if dims else None


def _reduce(fn_name):
    def run(x, dims, keepdim):
        torch = _torch()
        if not dims:
            dims = list(range(x.dim()))
        return getattr(torch, fn_name)(x, dim=list(dims), keepdim=keepdim)
    return run


def _prod(x, dims, keepdim):
    for d in sorted((d % max(x.dim(), 1) for d in (dims or range(x.dim()))), reverse=True):
        x = x.prod(dim=d, keepdim=keepdim) if x.dim() else x
    return x


def _any_all(fn_name):
    def run(x, dims, keepdim):
        torch = _torch()
        return getattr(torch, fn_name)(x, dim=tuple(dims) if dims else tuple(range(x.dim())),
                                       keepdim=keepdim)
    return run


for _name in ["sum", "mean", "amax", "amin"]:
    define(_name, "x", rules.reduce(accumulate=_name == "sum"), _reduce(_name), "reduction",
           f"{_name} over dims", dims=[], keepdim=False)
define("prod", "x", rules.reduce(accumulate=True), _prod, "reduction", "product over dims",
       dims=[], keepdim=False)
for _name in ["any", "all"]:
    define(_name, "x", rules.reduce(DType.bool), _any_all(_name), "reduction",
           f"logical {_name} over dims", dims=[], keepdim=False)


def _var(x, dims, correction, keepdim):
    return _torch().var(x, dim=_dims(dims), correction=correction, keepdim=keepdim)


define("var", "x", rules.reduce(), _var, "reduction", "variance with Bessel correction",
       dims=[], correction=1, keepdim=False)


def _arg(fn_name):
    def run(x, dim, keepdim):
        return getattr(_torch(), fn_name)(x, dim=dim, keepdim=keepdim)
    return run


for _name in ["argmax", "argmin"]:
    define(_name, "x", rules.arg_reduce, _arg(_name), "reduction",
           f"{_name} along dim (flattened when dim is none)", dim=None, keepdim=False)


def _softmax(fn_name):
    def run(x, dim):
        return getattr(_torch(), fn_name)(x, dim=dim)
    return run


define("softmax", "x", rules.unary, _softmax("softmax"), "reduction",
       "exp(x - max) / sum(exp(x - max)) along dim", dim=-1)
define("log_softmax", "x", rules.unary, _softmax("log_softmax"), "reduction",
       "x - max - log(sum(exp(x - max))) along dim", dim=-1)
define("cumsum", "x", rules.cumulative, lambda x, dim: _torch().cumsum(x, dim=dim), "reduction",
       "inclusive prefix sum along dim", dim=-1)
