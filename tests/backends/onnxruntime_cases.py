"""Sample graphs, one or more per IR op, for the onnxruntime op-table tests.

Each case builds a small graph with the Graph API (so output types come from the op table) over
inputs whose first dim is the size symbol s0 where that makes sense, and says how to draw valid
inputs (ranges for functions with restricted domains, index bounds for gathers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from compiler.ir import DType, Graph, TensorType, symbol

S = symbol("s0")
F, I64, B = DType.f32, DType.i64, DType.bool


@dataclass(frozen=True)
class Case:
    build: Callable[[Graph], list]
    ranges: dict[str, tuple] = field(default_factory=dict)  # input name -> (low, high)
    tol: float = 1e-5
    sizes: tuple[int, ...] = (2, 7)


def t(dtype: DType, *shape) -> TensorType:
    return TensorType(dtype, shape)


def op(g: Graph, name: str, inputs: list, **attrs):
    return g.add_node(name, inputs, attrs)


def weight(g: Graph, name: str, array: np.ndarray):
    return g.add_weight(name, TensorType(DType.from_numpy(array.dtype), array.shape), array)


def unary(name: str, dtype: DType = F, low: float = -3.0, high: float = 3.0, tol: float = 1e-5,
          **attrs) -> Case:
    def build(g):
        return [op(g, name, [g.add_input("x", t(dtype, S, 5))], **attrs).output]
    return Case(build, {"x": (low, high)}, tol)


def binary(name: str, dtype: DType = F, low: float = -3.0, high: float = 3.0, b_low=None,
           b_high=None, **attrs) -> Case:
    """a: [s0, 4] with b: [4] (broadcasting) and a second use with b: [s0, 4]."""
    def build(g):
        a = g.add_input("a", t(dtype, S, 4))
        b = g.add_input("b", t(dtype, 4))
        c = g.add_input("c", t(dtype, S, 4))
        return [op(g, name, [a, b], **attrs).output, op(g, name, [a, c], **attrs).output]
    b_range = (low if b_low is None else b_low, high if b_high is None else b_high)
    return Case(build, {"a": (low, high), "b": b_range, "c": b_range})


def rng_arrays(seed: int, *shapes) -> list[np.ndarray]:
    gen = np.random.default_rng(seed)
    return [gen.standard_normal(s).astype(np.float32) for s in shapes]


def _linear(g, bias=True, rank=3):
    x = g.add_input("x", t(F, *((2, S, 6) if rank == 3 else (S, 6))[:rank]))
    w, b = rng_arrays(1, (5, 6), (5,))
    return [op(g, "linear", [x, weight(g, "w", w), weight(g, "b", b) if bias else None]).output]


def _norm(name, affine=True, **attrs):
    def build(g):
        x = g.add_input("x", t(F, S, 3, 8))
        w, b = rng_arrays(2, (8,), (8,))
        ins = [x, weight(g, "w", w) if affine else None]
        if name == "layer_norm":
            ins.append(weight(g, "b", b) if affine else None)
        return [op(g, name, ins, normalized_shape=[8], **attrs).output]
    return build


def _group_norm(g):
    x = g.add_input("x", t(F, S, 6, 4, 3))
    w, b = rng_arrays(3, (6,), (6,))
    return [op(g, "group_norm", [x, weight(g, "w", w), weight(g, "b", b)], groups=3).output]


def _batch_norm(g):
    x = g.add_input("x", t(F, S, 4, 5))
    w, b, m = rng_arrays(4, (4,), (4,), (4,))
    var = np.abs(rng_arrays(5, (4,))[0]) + 0.5
    return [op(g, "batch_norm", [x, weight(g, "w", w), None, weight(g, "m", m),
                                 weight(g, "v", var)]).output]


def _embedding(g):
    idx = g.add_input("idx", t(I64, 2, S))
    return [op(g, "embedding", [weight(g, "table", rng_arrays(6, (10, 4))[0]), idx]).output]


def _conv(rank, **attrs):
    def build(g):
        spatial = (9,) * (rank - 2)
        x = g.add_input("x", t(F, S, 4, *spatial))
        groups = attrs.get("groups", 1)
        w, b = rng_arrays(7, (6, 4 // groups, *(3,) * (rank - 2)), (6,))
        n = rank - 2
        full = dict(stride=[1] * n, padding=[0] * n, dilation=[1] * n)
        full.update(attrs)
        return [op(g, "conv", [x, weight(g, "w", w), weight(g, "b", b)], **full).output]
    return build


def _pool(name, **attrs):
    def build(g):
        return [op(g, name, [g.add_input("x", t(F, S, 3, 9, 8))], **attrs).output]
    return build


def _sdpa(mask=None, gqa=False, **attrs):
    def build(g):
        q = g.add_input("q", t(F, 2, 4, S, 8))
        kv_heads = 2 if gqa else 4
        k = g.add_input("k", t(F, 2, kv_heads, S, 8))
        v = g.add_input("v", t(F, 2, kv_heads, S, 8))
        m = None
        if mask == "bool":
            m = g.add_input("m", t(B, 1, 1, S, S))
        elif mask == "float":
            m = g.add_input("m", t(F, 2, 1, 1, S))
        return [op(g, "scaled_dot_product_attention", [q, k, v, m], enable_gqa=gqa,
                   **attrs).output]
    return build


def _reduce(name, dtype=F, **attrs):
    def build(g):
        return [op(g, name, [g.add_input("x", t(dtype, S, 3, 4))], **attrs).output]
    return build


def _single(name, dtype=F, shape=(S, 3, 4), **attrs):
    def build(g):
        return [op(g, name, [g.add_input("x", t(dtype, *shape))], **attrs).output]
    return build


def _index(*positions):
    def build(g):
        x = g.add_input("x", t(F, S, 5, 6, 3))
        idx = [None] * 3
        for p, shape in positions:
            idx[p] = g.add_input(f"i{p}", t(I64, *shape))
        return [op(g, "index", [x, *idx]).output]
    return build


def _gather(name):
    def build(g):
        x = g.add_input("x", t(F, S, 5))
        shape = (S, 3) if name == "gather" else (4,)
        return [op(g, name, [x, g.add_input("i", t(I64, *shape))], dim=1).output]
    return build


def _scatter(g):
    x = g.add_input("x", t(F, S, 5))
    i = g.add_input("i", t(I64, S, 3))
    src = g.add_input("src", t(F, S, 3))
    return [op(g, "scatter", [x, i, src], dim=1, reduce=r).output for r in ("sum", "amax")]


def _latent_attention(g):
    q = g.add_input("q", t(F, 1, 4, S, 16))
    latent = g.add_input("latent", t(F, 1, 1, S, 16))
    k_rope = g.add_input("k_rope", t(F, 1, 1, S, 8))
    w = weight(g, "kv_b", np.random.default_rng(0).standard_normal((80, 16)).astype(np.float32))
    return [op(g, "latent_attention", [q, latent, k_rope, w, None], num_heads=4, nope_head_dim=8,
               v_head_dim=12, scale=0.25, is_causal=True).output]


def _concat(g):
    a, b = g.add_input("a", t(F, S, 2)), g.add_input("b", t(F, S, 3))
    return [op(g, "concat", [a, b, a], dim=1).output]


def _where(g):
    c = g.add_input("c", t(B, S, 4))
    a, b = g.add_input("a", t(F, S, 4)), g.add_input("b", t(F, 4))
    return [op(g, "where", [c, a, b]).output]


def _creation(g):
    x = g.add_input("x", t(F, S, 3))
    full = op(g, "full", [], shape=[S, 3], value=1.5, dtype=F).output
    c = op(g, "constant", [], value=-2.0, dtype=F).output
    rng = op(g, "arange", [], end=S, dtype=I64).output
    frng = op(g, "arange", [], start=0.5, end=2.0, step=0.25, dtype=F).output
    return [op(g, "add", [op(g, "mul", [x, full]).output, c]).output, rng, frng]


def _reshape(g):
    x = g.add_input("x", t(F, 2, S, 6))
    r = op(g, "reshape", [x], shape=[2 * S, 3, 2]).output
    return [op(g, "reshape", [r], shape=[-1, 6]).output]


def _slice(g):
    x = g.add_input("x", t(F, S, 6))
    a = op(g, "slice", [x], dim=1, start=1, end=6, step=2).output
    b = op(g, "slice", [x], dim=0, start=0, end=S - 1).output
    return [a, b, op(g, "slice", [x], dim=1, start=-3, end=2**63 - 1).output]


def _select(g):
    x = g.add_input("x", t(F, S, 6))
    return [op(g, "select", [x], dim=1, index=-2).output,
            op(g, "select", [x], dim=0, index=S - 1).output]


def _expand(g):
    x = g.add_input("x", t(F, S, 1, 3))
    return [op(g, "expand", [x], shape=[2, -1, 4, 3]).output]


def _repeat(g):
    return [op(g, "repeat", [g.add_input("x", t(F, S, 3))], repeats=[2, 1, 3]).output]


def _cast(dtype_in, dtype_out):
    def build(g):
        return [op(g, "cast", [g.add_input("x", t(dtype_in, S, 4))], dtype=dtype_out).output]
    return build


def _topk(g):
    x = g.add_input("x", t(F, S, 7))
    return list(g.add_node("topk", [x], {"k": 3, "dim": 1}).outputs)


def _half(name):
    """A compute op on float16, which runs in float32 between casts."""
    def build(g):
        a, b = g.add_input("a", t(DType.f16, S, 4)), g.add_input("b", t(DType.f16, S, 4))
        return [op(g, name, [a, b]).output]
    return build


def _rotary(g):
    x = g.add_input("x", t(F, 1, 4, S, 8))
    cos, sin = g.add_input("cos", t(F, 1, 1, S, 8)), g.add_input("sin", t(F, 1, 1, S, 8))
    return [op(g, "rotary_embedding", [x, cos, sin]).output]


def _multi_head(rotary: bool, causal: bool, size: int = 16,
                mask_type: TensorType | None = None, **attrs):
    """Attention on [b, s, h*d] projections: 4 query heads, 2 KV heads of `size`. The rotary
    tables are cos/sin of concat(f, f) (equal halves), so the causal form fits dayzero's
    CausalAttention (and GroupQueryAttention when the head size is a multiple of 16); the others
    run the decomposition."""
    def build(g):
        q = g.add_input("q", t(F, 2, S, 4 * size))
        k, v = g.add_input("k", t(F, 2, S, 2 * size)), g.add_input("v", t(F, 2, S, 2 * size))
        tables = [None, None]
        if rotary:
            f = g.add_input("f", t(F, 1, 1, S, size // 2))
            both = op(g, "concat", [f, f], dim=-1).output
            tables = [op(g, "cos", [both]).output, op(g, "sin", [both]).output]
        mask = None if causal else g.add_input("m", mask_type or t(B, 1, 1, S, S))
        return [op(g, "multi_head_attention", [q, k, v, *tables, mask], num_heads=4,
                   kv_num_heads=2, is_causal=causal, **attrs).output]
    return build


def _paged(rotary: bool):
    """A generation step of s0 tokens over a 12-slot pool: 4 query heads, 2 KV heads of 8.
    Slots are drawn from [-3, 11]: pool slots, new tokens 0 and 1 (-2, -3) and padding (-1)."""
    def build(g):
        tables = [g.add_input(n, t(F, S, 8)) for n in ("cos", "sin")] if rotary else [None] * 2
        q = g.add_input("q", t(F, 1, S, 32))
        k, v = g.add_input("k", t(F, 1, S, 16)), g.add_input("v", t(F, 1, S, 16))
        caches = [g.add_input(n, t(F, 12, 2, 8)) for n in ("k_cache", "v_cache")]
        slots = g.add_input("seq_slots", t(I64, 3, 10))
        seq, length = g.add_input("token_seq", t(I64, S)), g.add_input("token_len", t(I64, S))
        node = op(g, "paged_attention", [q, k, v, *tables, *caches, slots, seq, length],
                  num_heads=4, kv_num_heads=2, window=None if rotary else 6)
        return list(node.outputs)
    return build


def _paged_latent(g):
    """A step of s0 tokens over a 12-slot pool of latents (16) and rotary keys (8), 4 heads."""
    q = g.add_input("q", t(F, 1, 4, S, 16))
    latent = g.add_input("latent", t(F, 1, 1, S, 16))
    k_rope = g.add_input("k_rope", t(F, 1, 1, S, 8))
    w = weight(g, "kv_b", np.random.default_rng(0).standard_normal((80, 16)).astype(np.float32))
    caches = [g.add_input(n, t(F, 12, 1, width)) for n, width in (("k_cache", 16),
                                                                  ("v_cache", 8))]
    slots = g.add_input("seq_slots", t(I64, 3, 10))
    seq, length = g.add_input("token_seq", t(I64, S)), g.add_input("token_len", t(I64, S))
    node = op(g, "paged_latent_attention", [q, latent, k_rope, w, *caches, slots, seq, length],
              num_heads=4, nope_head_dim=8, v_head_dim=12, window=6)
    return list(node.outputs)


_PAGED_RANGES = {"seq_slots": (-3, 11), "token_seq": (0, 2), "token_len": (1, 10), "q": (-1, 1)}


def _quantized_linear(bits: int, bias: bool, activations: str = "float", out: int = 5,
                      half_scales: bool = False):
    """int4 / int8 weights in MatMulNBits' layout, from quantize_weights' own quantizer (float32
    or float16 scales)."""
    def build(g):
        from passes.quantize_weights import quantize, quantize_half_scales

        x = g.add_input("x", t(F, 2, S, 64))
        w, b = rng_arrays(11, (out, 64), (out,))
        rule = quantize_half_scales if half_scales else quantize
        codes, scales = (a.numpy() for a in rule(w, bits, 32))
        return [op(g, "quantized_linear", [x, weight(g, "q", codes), weight(g, "s", scales),
                                           weight(g, "b", b) if bias else None],
                   bits=bits, group_size=32, in_features=64, activations=activations).output]
    return build


def _fused_linear(layout, activation):
    def build(g):
        x = g.add_input("x", t(F, 2, S, 6))
        w, b = rng_arrays(8, (5, 6) if layout == "out_in" else (6, 5), (5,))
        return [op(g, "fused_linear", [x, weight(g, "w", w), weight(g, "b", b)],
                   activation=activation, weight_layout=layout).output]
    return build


def _gated_mlp(g):
    x = g.add_input("x", t(F, S, 6))
    gate, up, down = rng_arrays(9, (10, 6), (10, 6), (6, 10))
    return [op(g, "gated_mlp", [x, weight(g, "g", gate), weight(g, "u", up),
                                weight(g, "d", down), None, None, None]).output]


def _add_norm(name):
    def build(g):
        x, r = g.add_input("x", t(F, 1, S, 8)), g.add_input("r", t(F, 1, S, 8))
        w, b = rng_arrays(10, (8,), (8,))
        params = [weight(g, "w", w)] + ([weight(g, "b", b)] if name == "add_layer_norm" else [])
        return list(g.add_node(name, [x, r, *params], {"normalized_shape": [8]}).outputs)
    return build


def _one_rank_collectives(g):
    """Sharding annotations and collectives before partitioning (or over one rank)."""
    x = g.add_input("x", t(F, S, 4))
    y = op(g, "shard", [x], layout="tp:S0").output
    y = op(g, "all_reduce", [y], axis="tp").output
    y = op(g, "all_gather", [y], axis="tp", dim=0, ranks=[0]).output
    return [op(g, "reduce_scatter", [y], axis="tp", dim=1).output]


def _masked_scatter(g):
    x, src = g.add_input("x", t(F, S, 4)), g.add_input("src", t(F, S, 4))
    mask = g.add_input("mask", t(B, S, 1))  # broadcast over the last dim
    row = g.add_input("row", t(F, 4))  # broadcast with the mask: the result is [s0, 4]
    return [op(g, "masked_scatter", [x, mask, src]).output,
            op(g, "masked_scatter", [row, mask, src]).output]


def _resize(g):
    x = g.add_input("x", t(F, 1, 3, S, 5))
    return [op(g, "resize", [x], size=[4, 9], mode="bilinear").output,
            op(g, "resize", [x], size=[5, 3], mode="bilinear", align_corners=True).output,
            op(g, "resize", [x], size=[3, 7], mode="nearest").output]


def _sort(g):
    """Integer keys with ties (stable order), and floats sorted descending along dim 0."""
    keys = g.add_input("keys", t(I64, S, 6))
    x = g.add_input("x", t(F, S, 3))
    return [*g.add_node("sort", [keys], {"dim": 1}).outputs,
            *g.add_node("sort", [x], {"dim": 0, "descending": True}).outputs]


def _histc(g):
    """Values inside, on the edges of and outside [0, 3]."""
    x = g.add_input("x", t(F, S, 4))
    return [op(g, "histc", [x], bins=4, min=0.0, max=3.0).output]


def _grouped_matmul(g):
    """Offsets with an empty group and rows past the last offset (which are zero)."""
    x = g.add_input("x", t(F, S, 4))
    w = weight(g, "w", rng_arrays(11, (3, 4, 5))[0])
    offsets = weight(g, "offsets", np.array([1, 1, 2], dtype=np.int32))
    return [op(g, "grouped_matmul", [x, w, offsets]).output]


def _index_put(g):
    """The inverse of a permutation (inv[perm] = arange) and an accumulating row scatter."""
    perm = op(g, "sort", [g.add_input("keys", t(F, S))]).outputs[1]
    rows = op(g, "arange", [], start=0, end=S, step=1, dtype=I64).output
    empty = op(g, "full", [], shape=[S], value=0, dtype=I64).output
    x = g.add_input("x", t(F, 3, 4))
    idx = g.add_input("idx", t(I64, S))
    values = g.add_input("values", t(F, S, 4))
    return [op(g, "index_put", [empty, rows, perm]).output,
            op(g, "index_put", [x, values, idx], accumulate=True).output]


def _moe(routing: str, normalize: bool = False, bias: bool = False, scale: float = 1.0,
         shared: str = "", **groups):
    """A moe over 4 experts; `shared` "plain" or "gated" adds a shared expert (inner size 16),
    `groups` the group-limited routing attributes."""
    def build(g):
        x = g.add_input("x", t(F, S, 8))
        logits = g.add_input("logits", t(F, S, 4))
        w1, w2, b1, b2, sb, sg, su, sd, gate = rng_arrays(
            12, (4, 8, 12), (4, 6, 8), (4, 12), (4, 8), (4,), (16, 8), (16, 8), (8, 16), (1, 8))
        ins = [x, logits, weight(g, "w1", w1), weight(g, "w2", w2),
               weight(g, "b1", b1) if bias else None, weight(g, "b2", b2) if bias else None,
               weight(g, "sb", sb) if routing == "sigmoid_topk" else None]
        if shared:  # scaled so the shared expert's output is of the routed sum's size
            sg, su, sd = sg * 0.3, su * 0.3, sd * 0.3
            ins += [weight(g, "sg", sg), weight(g, "su", su), weight(g, "sd", sd),
                    weight(g, "gate", gate) if shared == "gated" else None]
        return [op(g, "moe", ins, top_k=2, routing=routing, normalize=normalize,
                   scale=scale, **groups).output]
    return build


def _quantized_moe(bits: int, bias: bool = False, routing: str = "softmax_topk",
                   activations: str = "float"):
    """A quantized_moe over 4 experts (hidden 64, inner 32, groups of 32) with codes from
    quantize_weights' own quantizer, one expert matrix at a time."""
    def build(g):
        from passes.quantize_weights import quantize

        x = g.add_input("x", t(F, S, 64))
        logits = g.add_input("logits", t(F, S, 4))
        gate_up, down, b1, b2, sb = rng_arrays(13, (4, 64, 64), (4, 64, 32), (4, 64), (4, 64),
                                               (4,))
        stacks = []
        for name, stack in (("gu", gate_up), ("down", down)):
            codes, scales = quantize(stack.reshape(-1, stack.shape[2]) * 0.3, bits, 32)
            stacks += [weight(g, f"{name}_q", codes.numpy().reshape(4, 64, -1, 16 * bits // 4)),
                       weight(g, f"{name}_s", scales.numpy().reshape(4, 64, -1))]
        ins = [x, logits, *stacks, weight(g, "b1", b1) if bias else None,
               weight(g, "b2", b2) if bias else None,
               weight(g, "sb", sb) if routing == "sigmoid_topk" else None]
        return [op(g, "quantized_moe", ins, bits=bits, group_size=32, top_k=2, routing=routing,
                   normalize=True, activations=activations).output]
    return build


CASES: dict[str, Case] = {
    **{name: unary(name) for name in [
        "neg", "abs", "exp", "exp2", "expm1", "sin", "cos", "atan", "sinh", "cosh", "tanh",
        "asinh", "sigmoid", "relu", "erf", "floor", "ceil", "round", "trunc", "sign", "frac",
        "silu", "quick_gelu", "hardsigmoid", "hardswish", "isnan", "isinf"]},
    **{name: unary(name, low=0.1, high=4.0) for name in
       ["log", "log2", "log10", "sqrt", "rsqrt", "reciprocal", "log1p"]},
    "tan": unary("tan", low=-1.2, high=1.2),
    "asin": unary("asin", low=-0.99, high=0.99),
    "acos": unary("acos", low=-0.99, high=0.99),
    "atanh": unary("atanh", low=-0.95, high=0.95),
    "acosh": unary("acosh", low=1.01, high=5.0),
    "erfinv": unary("erfinv", low=-0.99, high=0.99),
    "gelu": unary("gelu"),
    "gelu_tanh": unary("gelu", approximate="tanh"),
    "leaky_relu": unary("leaky_relu", negative_slope=0.2),
    "softplus": unary("softplus", beta=2.0, threshold=1.0),
    "elu": unary("elu", alpha=0.7),
    "clamp": unary("clamp", min=-1.0, max=0.5),
    "clamp_min": unary("clamp", min=-0.5),
    "neg_i64": unary("neg", dtype=I64, low=-5, high=5),
    "abs_i64": unary("abs", dtype=I64, low=-5, high=5),
    "floor_i64": unary("floor", dtype=I64, low=-5, high=5),
    "logical_not": unary("logical_not", dtype=B),
    "bitwise_not": unary("bitwise_not", dtype=I64, low=-9, high=9),
    "bitwise_not_bool": unary("bitwise_not", dtype=B),
    "cast_f32_i64": Case(_cast(F, I64)),
    "cast_f32_bool": Case(_cast(F, B)),
    "cast_i64_f32": Case(_cast(I64, F), {"x": (-9, 9)}),
    "cast_f32_f16": Case(_cast(F, DType.f16), tol=1e-3),
    **{name: binary(name) for name in ["add", "sub", "mul", "maximum", "minimum", "atan2", "div"]},
    "pow": binary("pow", low=0.2, high=2.0),
    "remainder": binary("remainder", b_low=0.5, b_high=2.0),
    "remainder_neg": binary("remainder", b_low=-2.0, b_high=-0.5),
    "fmod": binary("fmod", b_low=0.5, b_high=2.0),
    "remainder_i64": binary("remainder", dtype=I64, low=-9, high=9, b_low=1, b_high=4),
    "fmod_i64": binary("fmod", dtype=I64, low=-9, high=9, b_low=1, b_high=4),
    "div_trunc": binary("div", rounding_mode="trunc"),
    "div_floor": binary("div", rounding_mode="floor"),
    "div_floor_i64": binary("div", dtype=I64, low=-9, high=9, b_low=1, b_high=4,
                            rounding_mode="floor"),
    "div_trunc_i64": binary("div", dtype=I64, low=-9, high=9, b_low=1, b_high=4,
                            rounding_mode="trunc"),
    "add_i64": binary("add", dtype=I64, low=-9, high=9),
    **{name: binary(name, dtype=I64, low=-9, high=9)
       for name in ["bitwise_and", "bitwise_or", "bitwise_xor"]},
    **{f"{name}_bool": binary(name, dtype=B) for name in ["bitwise_and", "bitwise_or", "add"]},
    **{name: binary(name) for name in ["logical_and", "logical_or", "logical_xor"]},
    "logical_and_bool": binary("logical_and", dtype=B),
    **{name: binary(name, dtype=I64, low=-2, high=2)
       for name in ["eq", "ne", "lt", "le", "gt", "ge"]},
    "lt_f32": binary("lt"),
    "where": Case(_where),
    "matmul": Case(lambda g: [op(g, "matmul", [g.add_input("a", t(F, 2, S, 6)),
                                               g.add_input("b", t(F, 6, 5))]).output]),
    "matmul_batched": Case(lambda g: [op(g, "matmul", [g.add_input("a", t(F, 3, 1, S, 6)),
                                                       g.add_input("b", t(F, 2, 6, 4))]).output]),
    "linear": Case(_linear),
    "linear_2d": Case(lambda g: _linear(g, rank=2)),
    "linear_nobias": Case(lambda g: _linear(g, bias=False)),
    "layer_norm": Case(_norm("layer_norm")),
    "layer_norm_noaffine": Case(_norm("layer_norm", affine=False)),
    "rms_norm": Case(_norm("rms_norm")),
    "rms_norm_noweight": Case(_norm("rms_norm", affine=False, eps=1e-5)),
    "group_norm": Case(_group_norm),
    "batch_norm": Case(_batch_norm),
    "embedding": Case(_embedding, {"idx": (0, 9)}),
    "conv1d": Case(_conv(3, padding=[1], stride=[2])),
    "conv2d": Case(_conv(4, groups=2, dilation=[2, 1], padding=[1, 2])),
    "max_pool": Case(_pool("max_pool", kernel=[3, 2], stride=[2, 2], padding=[1, 0],
                           dilation=[1, 1])),
    "max_pool_ceil": Case(_pool("max_pool", kernel=[2, 3], stride=[2, 2], padding=[0, 1],
                                dilation=[1, 1], ceil_mode=True)),
    "avg_pool": Case(_pool("avg_pool", kernel=[3, 3], stride=[2, 2], padding=[1, 1],
                           count_include_pad=False)),
    "avg_pool_divisor": Case(_pool("avg_pool", kernel=[2, 2], stride=[2, 2], padding=[0, 0],
                                   divisor_override=3)),
    "adaptive_avg_pool_1": Case(_pool("adaptive_avg_pool", output_size=[1, 1])),
    "adaptive_avg_pool_even": Case(_pool("adaptive_avg_pool", output_size=[3, 4])),
    "adaptive_avg_pool_uneven": Case(_pool("adaptive_avg_pool", output_size=[4, 3])),
    "sdpa": Case(_sdpa()),
    "sdpa_causal": Case(_sdpa(is_causal=True)),
    "sdpa_bool_mask": Case(_sdpa("bool")),
    "sdpa_float_mask": Case(_sdpa("float", scale=0.3)),
    "sdpa_gqa_causal": Case(_sdpa(gqa=True, is_causal=True)),
    "sdpa_window": Case(_sdpa(gqa=True, is_causal=True, window=3)),
    "sdpa_window_softcap": Case(_sdpa(gqa=True, is_causal=True, window=3, softcap=2.0)),
    "sdpa_softcap_mask": Case(_sdpa("bool", softcap=1.5)),
    "sum": Case(_reduce("sum", dims=[1, 2])),
    "sum_all": Case(_reduce("sum")),
    "mean": Case(_reduce("mean", dims=[-1], keepdim=True)),
    "amax": Case(_reduce("amax", dims=[1])),
    "amin": Case(_reduce("amin", dims=[0, 2], keepdim=True)),
    "prod": Case(_reduce("prod", dims=[2])),
    "any": Case(_reduce("any", dtype=B, dims=[1])),
    "all": Case(_reduce("all", dtype=B, dims=[2], keepdim=True)),
    "any_f32": Case(_reduce("any", dims=[1]), {"x": (-1, 1)}),
    "var": Case(_reduce("var", dims=[2])),
    "var_symbolic": Case(_reduce("var", dims=[0, 1], correction=0)),
    "argmax": Case(_reduce("argmax", dim=1)),
    "argmin_flat": Case(_reduce("argmin", keepdim=True)),
    "softmax": Case(_reduce("softmax", dim=1)),
    "log_softmax": Case(_reduce("log_softmax")),
    "cumsum": Case(_reduce("cumsum", dim=0)),
    "topk": Case(_topk),
    "reshape": Case(_reshape),
    "permute": Case(_single("permute", dims=[2, 0, 1])),
    "expand": Case(_expand),
    "slice": Case(_slice),
    "select": Case(_select),
    "concat": Case(_concat),
    "gather": Case(_gather("gather"), {"i": (0, 4)}),
    "index_select": Case(_gather("index_select"), {"i": (0, 4)}),
    "index_one": Case(_index((1, (2, 3))), {"i1": (-5, 4)}),
    "index_adjacent": Case(_index((1, (4,)), (2, (2, 1))), {"i1": (0, 4), "i2": (0, 5)}),
    "index_apart": Case(_index((0, (3,)), (2, (3,))), {"i0": (0, 1), "i2": (-6, 5)}),
    "pad": Case(_single("pad", pads=[1, 2, 0, 1], value=0.5)),
    "flip": Case(_single("flip", dims=[0, 2])),
    "tril": Case(_single("tril", diagonal=1)),
    "triu": Case(_single("triu", dtype=I64, diagonal=-1), {"x": (-5, 5)}),
    "repeat": Case(_repeat),
    "creation": Case(_creation),
    "rotary_embedding": Case(_rotary),
    "multi_head_attention_gqa": Case(_multi_head(rotary=True, causal=True), {"f": (-3, 3)}),
    "multi_head_attention_plain_gqa": Case(_multi_head(rotary=False, causal=True)),
    "multi_head_attention_size8": Case(_multi_head(rotary=True, causal=True, size=8),
                                       {"f": (-3, 3)}),
    "multi_head_attention_masked": Case(_multi_head(rotary=True, causal=False),
                                        {"f": (-3, 3)}),
    "multi_head_attention_bool_mask": Case(_multi_head(rotary=False, causal=False)),
    "multi_head_attention_window": Case(_multi_head(rotary=True, causal=True, window=4),
                                        {"f": (-3, 3)}),
    "multi_head_attention_window_softcap": Case(
        _multi_head(rotary=False, causal=True, window=1, softcap=0.5)),
    "multi_head_attention_softcap": Case(_multi_head(rotary=True, causal=True, softcap=2.0),
                                         {"f": (-3, 3)}),
    "multi_head_attention_padding": Case(_multi_head(rotary=False, causal=False,
                                                     mask_type=t(F, 2, 1, 1, S)),
                                         {"m": (-2, 2)}),
    "paged_attention": Case(_paged(rotary=True), _PAGED_RANGES),
    "paged_attention_window": Case(_paged(rotary=False), _PAGED_RANGES),
    "fused_linear_gelu": Case(_fused_linear("out_in", "gelu")),
    "fused_linear_in_out_silu": Case(_fused_linear("in_out", "silu")),
    "gated_mlp": Case(_gated_mlp),
    "quantized_linear_int4": Case(_quantized_linear(4, bias=True)),
    "quantized_linear_int8": Case(_quantized_linear(8, bias=False)),
    # 16 outputs, int8 activations: dayzero's MatMulInt4 where its library is built
    "quantized_linear_int4_int8": Case(_quantized_linear(4, bias=True, activations="int8",
                                                         out=16, half_scales=True)),
    "add_rms_norm": Case(_add_norm("add_rms_norm")),
    "add_layer_norm": Case(_add_norm("add_layer_norm")),
    "one_rank_collectives": Case(_one_rank_collectives),
    "add_f16": Case(_half("add"), tol=1e-3),
    "matmul_f16": Case(lambda g: [op(g, "matmul", [g.add_input("a", t(DType.f16, S, 4)),
                                                   g.add_input("b", t(DType.f16, 4, 3))]).output],
                       tol=1e-2),
    "masked_scatter": Case(_masked_scatter),
    "sort": Case(_sort, {"keys": (0, 3)}),
    "histc": Case(_histc, {"x": (-1.0, 4.0)}),
    "grouped_matmul": Case(_grouped_matmul),
    "index_put": Case(_index_put, {"idx": (0, 2)}),
    "moe": Case(_moe("softmax_topk", normalize=True)),
    "quantized_moe": Case(_quantized_moe(4)),
    "quantized_moe_bias_sigmoid": Case(_quantized_moe(4, bias=True, routing="sigmoid_topk")),
    "quantized_moe_int8": Case(_quantized_moe(8)),
    "quantized_moe_int8_activations": Case(_quantized_moe(4, activations="int8")),
    "quantized_moe_int8_both": Case(_quantized_moe(8, activations="int8")),
    "moe_bias": Case(_moe("softmax_topk", bias=True)),
    "moe_topk_softmax": Case(_moe("topk_softmax")),
    "moe_sigmoid": Case(_moe("sigmoid_topk", normalize=True, scale=2.5)),
    "moe_shared_gated": Case(_moe("softmax_topk", shared="gated")),
    "moe_deepseek_v3": Case(_moe("sigmoid_topk", normalize=True, scale=2.5, shared="plain",
                                 normalize_eps=1e-20, n_group=2, topk_group=1, group_top=2)),
    "moe_deepseek_v2": Case(_moe("softmax_topk", scale=1.5, shared="plain", n_group=2,
                                 topk_group=1, group_top=1, group_fill=0.0)),
    "scatter": Case(_scatter, {"i": (0, 4)}),
    "latent_attention": Case(_latent_attention),
    "paged_latent_attention": Case(_paged_latent, _PAGED_RANGES),
    "resize": Case(_resize),
}
