"""Model-level ATen ops kept whole: linear algebra, normalization, embedding, conv, pooling, SDPA.

Multi-result overloads (native_layer_norm's mean and rstd, max_pool's indices) return None for
the results the IR has no value for; a model that reads one gets an "unsupported" report.
"""

from __future__ import annotations

import torch

from ..emitter import AtenEmitter, Unsupported
from .table import converts

# -- linear algebra -----------------------------------------------------------------------------


@converts("linear.default", ir="linear")
def _linear(em: AtenEmitter, a):
    x, w, b = a["input"], a["weight"], a["bias"]
    if w.type.rank == 2:
        return em.op("linear", x, w, b)
    out = em.op("matmul", x, w)
    return out if b is None else em.op("add", out, b)


@converts("matmul.default", "mm.default", "bmm.default", ir="matmul")
def _matmul(em: AtenEmitter, a):
    return em.op("matmul", a["self"], a["other"] if "other" in a else a["mat2"])


@converts("mv.default", ir="matmul")
def _mv(em: AtenEmitter, a):
    return em.op("matmul", a["self"], a["vec"])


@converts("dot.default", ir="matmul")
def _dot(em: AtenEmitter, a):
    return em.op("matmul", a["self"], a["tensor"])


@converts("addmm.default", ir="matmul, add")
def _addmm(em: AtenEmitter, a):
    dtype = em.out_dtype()
    product = em.op("matmul", a["mat1"], a["mat2"])
    if a["alpha"] != 1:
        product = em.op("mul", product, em.const(a["alpha"], dtype))
    if a["beta"] == 0:
        return product
    bias = a["self"]
    if a["beta"] != 1:
        bias = em.op("mul", bias, em.const(a["beta"], dtype))
    return em.op("add", product, bias)


# -- normalization ------------------------------------------------------------------------------
def _layer_norm(em: AtenEmitter, a):
    return em.op("layer_norm", a["input"], a["weight"], a["bias"],
                 normalized_shape=list(a["normalized_shape"]), eps=float(a["eps"]))


converts("layer_norm.default", ir="layer_norm")(_layer_norm)


@converts("native_layer_norm.default", ir="layer_norm")
def _native_layer_norm(em: AtenEmitter, a):
    return _layer_norm(em, a), None, None


@converts("rms_norm.default", ir="rms_norm")
def _rms_norm(em: AtenEmitter, a):
    x = a["input"]
    eps = a["eps"] if a["eps"] is not None else torch.finfo(x.dtype.to_torch()).eps
    return em.op("rms_norm", x, a["weight"], normalized_shape=list(a["normalized_shape"]),
                 eps=float(eps))


@converts("group_norm.default", ir="group_norm")
def _group_norm(em: AtenEmitter, a):
    return em.op("group_norm", a["input"], a["weight"], a["bias"], groups=a["num_groups"],
                 eps=float(a["eps"]))


@converts("native_group_norm.default", ir="group_norm")
def _native_group_norm(em: AtenEmitter, a):
    out = em.op("group_norm", a["input"], a["weight"], a["bias"], groups=a["group"],
                eps=float(a["eps"]))
    return out, None, None


@converts("_native_batch_norm_legit_no_training.default", ir="batch_norm")
def _batch_norm_inference(em: AtenEmitter, a):
    out = em.op("batch_norm", a["input"], a["weight"], a["bias"], a["running_mean"],
                a["running_var"], eps=float(a["eps"]))
    return out, None, None


@converts("batch_norm.default", ir="batch_norm")
def _batch_norm(em: AtenEmitter, a):
    if a["training"] or a["running_mean"] is None or a["running_var"] is None:
        raise Unsupported("batch_norm in training mode (batch statistics)")
    return _batch_norm_inference(em, a)[0]


@converts("embedding.default", ir="embedding")
def _embedding(em: AtenEmitter, a):
    return em.op("embedding", a["weight"], a["indices"])


# -- convolution and pooling --------------------------------------------------------------------
def _per_dim(value, n: int) -> list:
    values = [value] if isinstance(value, int) else list(value)
    return values * n if len(values) == 1 else values


@converts("convolution.default", ir="conv")
def _convolution(em: AtenEmitter, a):
    if a["transposed"]:
        raise Unsupported("transposed convolution")
    return _conv(em, a)


# conv1d/2d/3d as torch.export's training IR records them (before decomposition to
# `convolution`); an unbatched input gets its batch dim of 1 around the conv
@converts("conv1d.default", "conv2d.default", "conv3d.default", ir="conv")
def _conv_nd(em: AtenEmitter, a):
    n = a["weight"].type.rank - 2
    return _batched(em, a["input"], n, lambda x: _conv(em, {**a, "input": x}))


@converts("conv1d.padding", "conv2d.padding", "conv3d.padding", ir="conv")
def _conv_padding_mode(em: AtenEmitter, a):
    """padding="valid" or "same", as torch computes it: `same` pads d*(k-1) in all, half on
    each side, and the odd element on the right (a `pad` in front of the conv)."""
    n = a["weight"].type.rank - 2
    kernel = a["weight"].type.shape[2:]
    if not all(isinstance(k, int) for k in kernel):
        raise Unsupported("a convolution whose kernel size is symbolic")
    dilation = _per_dim(a["dilation"], n)
    if a["padding"] == "valid":
        total = [0] * n
    elif a["padding"] == "same":
        if any(s != 1 for s in _per_dim(a["stride"], n)):
            raise Unsupported("padding='same' with a stride other than 1")
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
    else:
        raise Unsupported(f"convolution padding {a['padding']!r}")
    left = [t // 2 for t in total]
    extra = [t - 2 * lo for t, lo in zip(total, left)]

    def build(x):
        if any(extra):  # torch's pad list runs from the last dim: (left, right) pairs
            pads = [p for e in reversed(extra) for p in (0, e)]
            x = em.op("pad", x, pads=pads, value=0.0 if x.dtype.is_float else 0)
        return _conv(em, {**a, "input": x, "padding": left})
    return _batched(em, a["input"], n, build)


def _conv(em: AtenEmitter, a):
    n = a["weight"].type.rank - 2
    return em.op("conv", a["input"], a["weight"], a["bias"], stride=_per_dim(a["stride"], n),
                 padding=_per_dim(a["padding"], n), dilation=_per_dim(a["dilation"], n),
                 groups=a["groups"])


def _batched(em: AtenEmitter, x, n: int, build):
    """Run `build` on a batched input: pooling rules want (N, C, *spatial); unbatched adds N=1."""
    if x.type.rank == n + 2:
        return build(x)
    out = build(em.op("reshape", x, shape=[1, *x.shape]))
    return em.op("reshape", out, shape=em.out_shape())


def _window(a, n: int) -> dict:
    kernel = _per_dim(a["kernel_size"], n)
    stride = _per_dim(a["stride"], n) if a["stride"] else kernel
    return {"kernel": kernel, "stride": stride, "padding": _per_dim(a["padding"], n),
            "ceil_mode": bool(a["ceil_mode"])}


def _max_pool(n: int, with_indices: bool):
    def convert(em: AtenEmitter, a):
        attrs = dict(_window(a, n), dilation=_per_dim(a["dilation"], n))
        out = _batched(em, a["self"], n, lambda x: em.op("max_pool", x, **attrs))
        return (out, None) if with_indices else out
    return convert


def _avg_pool(n: int):
    def convert(em: AtenEmitter, a):
        attrs = dict(_window(a, n), count_include_pad=bool(a["count_include_pad"]),
                     divisor_override=a.get("divisor_override"))
        return _batched(em, a["self"], n, lambda x: em.op("avg_pool", x, **attrs))
    return convert


for _n in (1, 2, 3):
    converts(f"max_pool{_n}d.default", ir="max_pool")(_max_pool(_n, False))
    converts(f"avg_pool{_n}d.default", ir="avg_pool")(_avg_pool(_n))
for _n in (2, 3):
    converts(f"max_pool{_n}d_with_indices.default", ir="max_pool")(_max_pool(_n, True))


@converts("adaptive_avg_pool1d.default", "adaptive_avg_pool2d.default",
          "_adaptive_avg_pool2d.default", "adaptive_avg_pool3d.default",
          "_adaptive_avg_pool3d.default", ir="adaptive_avg_pool")
def _adaptive_avg_pool(em: AtenEmitter, a):
    return em.op("adaptive_avg_pool", a["self"], output_size=list(a["output_size"]))


# -- attention ----------------------------------------------------------------------------------
def _sdpa(em: AtenEmitter, a):
    if a["dropout_p"] != 0:
        raise Unsupported("attention dropout (dropout_p > 0)")
    scale = a["scale"]
    return em.op("scaled_dot_product_attention", a["query"], a["key"], a["value"], a["attn_mask"],
                 is_causal=bool(a["is_causal"]), scale=None if scale is None else float(scale),
                 enable_gqa=bool(a.get("enable_gqa", False)))


converts("scaled_dot_product_attention.default", ir="scaled_dot_product_attention")(_sdpa)


@converts("_scaled_dot_product_flash_attention_for_cpu.default",
          ir="scaled_dot_product_attention")
def _sdpa_flash_cpu(em: AtenEmitter, a):
    return _sdpa(em, a), None
