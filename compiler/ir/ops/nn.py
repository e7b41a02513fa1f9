"""Model-level ops: linear algebra, normalization, embedding, convolution, pooling, attention.

Kept whole rather than decomposed, because backends have fast kernels for exactly these and
fusion patterns produce them.
"""

from __future__ import annotations

import math

from ..symbolic import equal
from ..types import TensorType
from . import shape_rules as rules
from .registry import REQUIRED, ShapeError, define


def _F():
    import torch.nn.functional as F

    return F


def _torch():
    import torch

    return torch


define("matmul", "a b", rules.matmul, lambda a, b: _torch().matmul(a, b), "matmul",
       "batched matrix product with numpy broadcasting")
define("linear", "x weight bias?", rules.linear, lambda x, w, b: _F().linear(x, w, b), "matmul",
       "x @ weight.T + bias")


def _norm_rule(types, attrs):
    x = types[0]
    normalized = attrs["normalized_shape"]
    if len(normalized) > x.rank or not all(
            equal(a, b) for a, b in zip(x.shape[x.rank - len(normalized):], normalized)):
        raise ShapeError(f"normalized_shape {list(normalized)} does not end {x}")
    return [x]


define("layer_norm", "x weight? bias?", _norm_rule,
       lambda x, w, b, normalized_shape, eps: _F().layer_norm(x, list(normalized_shape), w, b, eps),
       "normalization", "(x - mean) / sqrt(var + eps) * weight + bias over the last dims",
       normalized_shape=REQUIRED, eps=1e-5)
define("rms_norm", "x weight?", _norm_rule,
       lambda x, w, normalized_shape, eps: _F().rms_norm(x, list(normalized_shape), w, eps),
       "normalization", "x / sqrt(mean(x^2) + eps) * weight over the last dims",
       normalized_shape=REQUIRED, eps=1e-6)
define("group_norm", "x weight? bias?", rules.unary,
       lambda x, w, b, groups, eps: _F().group_norm(x, groups, w, b, eps), "normalization",
       "normalize over channel groups", groups=REQUIRED, eps=1e-5)
define("batch_norm", "x weight? bias? mean var", rules.unary,
       lambda x, w, b, mean, var, eps: _F().batch_norm(x, mean, var, w, b, False, 0.0, eps),
       "normalization", "inference batch norm with running statistics", eps=1e-5)


def _embedding(types, attrs):
    weight, indices = types
    return [TensorType(weight.dtype, indices.shape + weight.shape[1:])]


define("embedding", "weight indices", _embedding,
       lambda w, idx: _F().embedding(idx, w), "indexing", "rows of weight picked by indices")


def _window_out(size, kernel, stride, pad, dilation, ceil_mode=False):
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    if isinstance(span, int):
        out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
        if ceil_mode and (out - 1) * stride >= size + pad:
            out -= 1
        return out
    import sympy

    return (sympy.ceiling if ceil_mode else sympy.floor)(span / stride) + 1


def _spatial(types, attrs, channels, ceil_mode=False):
    x = types[0]
    n = x.rank - 2
    kernel = attrs.get("kernel") or types[1].shape[2:]
    dims = [_window_out(x.shape[2 + i], kernel[i], attrs["stride"][i], attrs["padding"][i],
                        attrs.get("dilation", [1] * n)[i], ceil_mode) for i in range(n)]
    return [x.with_shape((x.shape[0], channels) + tuple(dims))]


def _conv_rule(types, attrs):
    x, w = types[0], types[1]
    if x.rank != w.rank or x.rank not in (3, 4, 5):
        raise ShapeError(f"conv: input {x} and weight {w} need rank 3, 4 or 5")
    rules.same_dtype([t for t in types if t is not None], "conv")
    return _spatial(types, attrs, w.shape[0])


def _conv(x, w, b, stride, padding, dilation, groups):
    fn = {3: _F().conv1d, 4: _F().conv2d, 5: _F().conv3d}[x.dim()]
    return fn(x, w, b, stride, padding, dilation, groups)


define("conv", "x weight bias?", _conv_rule, _conv, "convolution",
       "N-d cross-correlation (1d, 2d or 3d by rank)", stride=REQUIRED, padding=REQUIRED,
       dilation=REQUIRED, groups=1)


def _pool_rule(types, attrs):
    return _spatial(types, attrs, types[0].shape[1], attrs["ceil_mode"])


def _max_pool(x, kernel, stride, padding, dilation, ceil_mode):
    fn = {3: _F().max_pool1d, 4: _F().max_pool2d, 5: _F().max_pool3d}[x.dim()]
    return fn(x, kernel, stride, padding, dilation, ceil_mode)


def _avg_pool(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    fn = {3: _F().avg_pool1d, 4: _F().avg_pool2d, 5: _F().avg_pool3d}[x.dim()]
    extra = () if x.dim() == 3 else (divisor_override,)
    return fn(x, kernel, stride, padding, ceil_mode, count_include_pad, *extra)


define("max_pool", "x", _pool_rule, _max_pool, "pooling", "N-d max pooling", kernel=REQUIRED,
       stride=REQUIRED, padding=REQUIRED, dilation=REQUIRED, ceil_mode=False)
define("avg_pool", "x", _pool_rule, _avg_pool, "pooling", "N-d average pooling", kernel=REQUIRED,
       stride=REQUIRED, padding=REQUIRED, ceil_mode=False, count_include_pad=True,
       divisor_override=None)


def _adaptive_rule(types, attrs):
    x = types[0]
    size = tuple(attrs["output_size"])
    return [x.with_shape(x.shape[: x.rank - len(size)] + size)]


def _adaptive_avg_pool(x, output_size):
    n = len(output_size)
    fn = {1: _F().adaptive_avg_pool1d, 2: _F().adaptive_avg_pool2d, 3: _F().adaptive_avg_pool3d}[n]
    return fn(x, list(output_size))


define("adaptive_avg_pool", "x", _adaptive_rule, _adaptive_avg_pool, "pooling",
       "average pooling to a fixed output size", output_size=REQUIRED)


def _sdpa_rule(types, attrs):
    q, k, v, mask = types
    rules.same_dtype([q, k, v], "scaled_dot_product_attention")
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise ShapeError(f"attention: q {q}, k {k}, v {v} need one rank >= 2")
    if not equal(q.shape[-1], k.shape[-1]):
        raise ShapeError(f"attention: q head size {q.shape[-1]} vs k {k.shape[-1]}")
    if mask is not None:
        rules.broadcast_shapes(mask.shape, q.shape[:-1] + (k.shape[-2],))
    check_window_softcap(attrs, "scaled_dot_product_attention")
    return [q.with_shape(q.shape[:-1] + (v.shape[-1],))]


def check_window_softcap(attrs, what: str) -> None:
    """window and softcap: a positive int / a positive float, or None (off); a window only
    means something on causal attention (it counts keys back from each query's position)."""
    window, softcap = attrs["window"], attrs["softcap"]
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ShapeError(f"{what}: window {window!r} is not a positive integer")
        if not attrs["is_causal"]:
            raise ShapeError(f"{what}: window {window} needs is_causal=true")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not softcap > 0 or not math.isfinite(softcap)):
        raise ShapeError(f"{what}: softcap {softcap!r} is not a positive finite number")


def _sdpa(q, k, v, mask, is_causal, scale, enable_gqa, window=None, softcap=None):
    # The math backend: torch's default CPU kernel (flash attention) drops a NaN query row for
    # some shapes (torch 2.13: q [2, 4, 7, 8] with one NaN gives no NaN), and the reference
    # must not lose a NaN (tests/test_nonfinite.py). is_causal is computed here, not by the
    # math backend, which adds -inf to the hidden scores: a NaN or Inf key after a row's
    # position would make that row NaN, where torch's default is_causal kernel (and every
    # kernel dayzero lowers to) hides it.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if is_causal:
        return _causal_sdpa(q, k, v, scale, enable_gqa, window, softcap)
    if softcap is not None:
        return _softcapped_sdpa(q, k, v, mask, scale, enable_gqa, softcap)
    with sdpa_kernel(SDPBackend.MATH):
        return _F().scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                 scale=scale, enable_gqa=enable_gqa)


def _scores(q, k, v, scale, enable_gqa, softcap):
    """q k^T * scale, softcapped (softcap * tanh(scores / softcap), Gemma 2's eager order), with
    grouped KV heads repeated; and v repeated alike."""
    if enable_gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if softcap is not None:
        scores = (scores / softcap).tanh() * softcap
    return scores, v


def _causal_sdpa(q, k, v, scale, enable_gqa, window=None, softcap=None):
    """softmax(q k^T * scale with the hidden scores replaced by -inf) v, in the dense order of
    the math backend (so a NaN or Inf in v still reaches every row: 0 * NaN is NaN). Query i
    sees key j when j <= i and, with a window, j > i - window (transformers' sliding window)."""
    import torch

    scores, v = _scores(q, k, v, scale, enable_gqa, softcap)
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if window is not None:
        keep = keep.triu(1 - window)
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _softcapped_sdpa(q, k, v, mask, scale, enable_gqa, softcap):
    """The math backend's order with the scores softcapped before the mask is applied, and its
    safe softmax: a row whose every score is -inf attends to nothing (zeros, not NaN)."""
    import torch

    scores, v = _scores(q, k, v, scale, enable_gqa, softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool \
            else scores + mask
    probs = torch.softmax(scores, dim=-1)
    hidden = (scores == float("-inf")).all(dim=-1, keepdim=True)
    return probs.masked_fill(hidden, 0.0) @ v


define("scaled_dot_product_attention", "q k v mask?", _sdpa_rule, _sdpa, "attention",
       "softmax(q k^T * scale + mask) v, causal and grouped-query heads optional; window: "
       "causal query i sees keys i - window < j <= i; softcap: scores = softcap * "
       "tanh(scores / softcap) before the mask",
       is_causal=False, scale=None, enable_gqa=False, window=None, softcap=None)
