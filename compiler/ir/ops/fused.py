"""Fused ops that the fusion passes produce, each defined by its decomposition.

A fused op is a model-level pattern (rotary embedding, gated MLP, residual add + norm, a linear
with its activation epilogue) that a backend can run as one kernel. Its meaning is written once,
as a function that builds the unfused primitive nodes (`DECOMPOSITIONS`); that function is also
the op's reference semantics (`reference` runs the decomposition), so the reference backend checks
every fused op against exactly the nodes it replaced, and a backend without a dedicated kernel
lowers the decomposition instead. The existing model-level ops that fusion targets (rms_norm,
layer_norm, gelu, silu, scaled_dot_product_attention) keep their torch references and get a
decomposition here too, for the same fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..dtypes import DType
from ..graph import Graph, Node, Value
from ..symbolic import equal
from ..types import TensorType
from . import shape_rules as rules
from .registry import META_ATTRS, REQUIRED, ShapeError, define, get_op

# Activation epilogues by name -> (IR op, its attributes); "none" is the identity.
ACTIVATIONS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "none": None,
    "relu": ("relu", {}),
    "gelu": ("gelu", {"approximate": "none"}),
    "gelu_tanh": ("gelu", {"approximate": "tanh"}),
    "silu": ("silu", {}),
    "sigmoid": ("sigmoid", {}),
    "tanh": ("tanh", {}),
}

# torch's default eps (finfo.eps) for rms_norm when eps is none
_FINFO_EPS = {DType.f32: 1.1920928955078125e-07, DType.f16: 0.0009765625, DType.bf16: 0.0078125,
              DType.f64: 2.220446049250313e-16}


class Emitter:
    """Builds nodes into `graph`: appended, or inserted before `before`; all get `loc`.

    `created` lists the nodes in the order they were made (rewrites mark and report them).
    """

    def __init__(self, graph: Graph, before: Node | None = None, loc: str | None = None):
        self.graph = graph
        self.before = before
        self.loc = loc
        self.created: list[Node] = []

    def ops(self, name: str, *inputs: Value | None, **attrs: Any) -> list[Value]:
        # results are named after the op, numbered by the graph when the name is taken (readable
        # dumps); add_node pairs names with results, so spare names are simply not used
        node = self.graph.add_node(name, inputs, attrs, loc=self.loc, names=[name] * 8,
                                   before=self.before)
        self.created.append(node)
        return node.outputs

    def op(self, name: str, *inputs: Value | None, **attrs: Any) -> Value:
        return self.ops(name, *inputs, **attrs)[0]

    def const(self, value: float | int | bool, dtype: DType) -> Value:
        return self.op("constant", value=value, dtype=dtype)

    def activation(self, name: str, x: Value) -> Value:
        if name not in ACTIVATIONS:
            raise ShapeError(f"unknown activation '{name}'; use one of {sorted(ACTIVATIONS)}")
        spec = ACTIVATIONS[name]
        return x if spec is None else self.op(spec[0], x, **spec[1])


Decomposition = Callable[[Emitter, list, dict], list[Value]]
DECOMPOSITIONS: dict[str, Decomposition] = {}


def decomposes(name: str):
    def register(fn: Decomposition) -> Decomposition:
        DECOMPOSITIONS[name] = fn
        return fn
    return register


def decompose_into(emitter: Emitter, node: Node) -> list[Value]:
    """Build `node`'s decomposition with `emitter`; returns the values replacing its outputs."""
    if node.op not in DECOMPOSITIONS:
        raise ShapeError(f"op {node.op} has no decomposition")
    attrs = get_op(node.op).complete_attrs({k: v for k, v in node.attrs.items()
                                            if k not in META_ATTRS})
    return DECOMPOSITIONS[node.op](emitter, list(node.inputs), attrs)


def _reference(name: str):
    """Reference semantics of a fused op: build its decomposition for these tensors and run it."""
    def run(*tensors, **attrs):
        graph = Graph(f"decomposed_{name}")
        values = [None if t is None else graph.add_input(
            f"in{i}", TensorType(DType.from_torch(t.dtype), tuple(t.shape)))
            for i, t in enumerate(tensors)]
        outputs = DECOMPOSITIONS[name](Emitter(graph), values, attrs)
        env = {id(v): t for v, t in zip(values, tensors) if v is not None}
        for node in graph.nodes:
            args = [None if v is None else env[id(v)] for v in node.inputs]
            result = get_op(node.op).reference(*args, **node.attrs)
            for value, tensor in zip(node.outputs, result if isinstance(result, tuple)
                                     else (result,)):
                env[id(value)] = tensor
        results = tuple(env[id(v)] for v in outputs)
        return results[0] if len(results) == 1 else results
    return run


# -- shape rules ---------------------------------------------------------------------------------
def _check_activation(attrs) -> None:
    if attrs["activation"] not in ACTIVATIONS:
        raise ShapeError(f"unknown activation '{attrs['activation']}'; "
                         f"use one of {sorted(ACTIVATIONS)}")


def _rotary_rule(types, attrs):
    x = types[0]
    rules.same_dtype(types, "rotary_embedding")
    shape = rules.broadcast_shapes(*(t.shape for t in types))
    if len(shape) != x.rank or not all(equal(a, b) for a, b in zip(shape, x.shape)):
        raise ShapeError(f"rotary_embedding: cos {types[1]} and sin {types[2]} must broadcast "
                         f"to x {x}")
    if x.rank == 0 or (isinstance(x.shape[-1], int) and x.shape[-1] % 2):
        raise ShapeError(f"rotary_embedding: the last dim of x {x} must be even")
    return [x]


def _fused_linear_rule(types, attrs):
    x, w, bias = types
    _check_activation(attrs)
    if attrs["weight_layout"] == "out_in":
        return rules.linear(types, attrs)
    if attrs["weight_layout"] != "in_out":
        raise ShapeError(f"weight_layout is 'out_in' or 'in_out', got {attrs['weight_layout']!r}")
    if w.rank != 2 or not equal(x.shape[-1], w.shape[0]):
        raise ShapeError(f"fused_linear: input features {x.shape[-1]} vs in_out weight "
                         f"{list(w.shape)}")
    flipped = TensorType(w.dtype, (w.shape[1], w.shape[0]))
    return rules.linear([x, flipped, bias], attrs)


def _gated_mlp_rule(types, attrs):
    x, w_gate, w_up, w_down, b_gate, b_up, b_down = types
    _check_activation(attrs)
    gate = rules.linear([x, w_gate, b_gate], attrs)[0]
    up = rules.linear([x, w_up, b_up], attrs)[0]
    if not all(equal(a, b) for a, b in zip(gate.shape, up.shape)):
        raise ShapeError(f"gated_mlp: gate {gate} and up {up} projections differ")
    return rules.linear([gate, w_down, b_down], attrs)


def _add_norm_rule(types, attrs):
    x, residual, *params = types
    if x.dtype != residual.dtype or x.rank != residual.rank or not all(
            equal(a, b) for a, b in zip(x.shape, residual.shape)):
        raise ShapeError(f"add-norm: x {x} and residual {residual} must have one type")
    normalized = list(attrs["normalized_shape"])
    if len(normalized) > x.rank or not all(
            equal(a, b) for a, b in zip(x.shape[x.rank - len(normalized):], normalized)):
        raise ShapeError(f"normalized_shape {normalized} does not end {x}")
    for p in params:
        if p is not None and (p.rank != len(normalized) or not all(
                equal(a, b) for a, b in zip(p.shape, normalized))):
            raise ShapeError(f"add-norm: parameter {p} is not of shape {normalized}")
    return [x, x]


define("rotary_embedding", "x cos sin", _rotary_rule, _reference("rotary_embedding"), "fused",
       "x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) over the last dim")
define("fused_linear", "x weight bias?", _fused_linear_rule, _reference("fused_linear"), "fused",
       "activation(x @ weight^T + bias) (weight_layout out_in) or of x @ weight + bias (in_out)",
       activation="none", weight_layout="out_in")
define("gated_mlp", "x w_gate w_up w_down b_gate? b_up? b_down?", _gated_mlp_rule,
       _reference("gated_mlp"), "fused",
       "down(activation(gate(x)) * up(x)): SwiGLU with silu, GeGLU with gelu",
       activation="silu")
define("quick_gelu", "x", rules.unary, _reference("quick_gelu"), "fused",
       "x * sigmoid(alpha * x): CLIP's QuickGELU (alpha 1.702); alpha 1 is SiLU", alpha=1.702)
define("add_rms_norm", "x residual weight?", _add_norm_rule, _reference("add_rms_norm"), "fused",
       "(rms_norm(x + residual), x + residual): the residual add and the norm after it",
       normalized_shape=REQUIRED, eps=1e-6)
define("add_layer_norm", "x residual weight? bias?", _add_norm_rule,
       _reference("add_layer_norm"), "fused",
       "(layer_norm(x + residual), x + residual): the residual add and the norm after it",
       normalized_shape=REQUIRED, eps=1e-5)


# -- decompositions ------------------------------------------------------------------------------
def _norm_dims(attrs) -> list[int]:
    return list(range(-len(attrs["normalized_shape"]), 0))


@decomposes("rms_norm")
def _rms_norm(e: Emitter, inputs, attrs):
    x, weight = inputs
    eps = attrs["eps"] if attrs["eps"] is not None else _FINFO_EPS.get(x.dtype, 1e-6)
    mean = e.op("mean", e.op("mul", x, x), dims=_norm_dims(attrs), keepdim=True)
    out = e.op("mul", x, e.op("rsqrt", e.op("add", mean, e.const(eps, x.dtype))))
    return [out if weight is None else e.op("mul", out, weight)]


@decomposes("layer_norm")
def _layer_norm(e: Emitter, inputs, attrs):
    x, weight, bias = inputs
    dims = _norm_dims(attrs)
    centered = e.op("sub", x, e.op("mean", x, dims=dims, keepdim=True))
    var = e.op("mean", e.op("mul", centered, centered), dims=dims, keepdim=True)
    eps = e.const(attrs["eps"], x.dtype)
    out = e.op("mul", centered, e.op("rsqrt", e.op("add", var, eps)))
    if weight is not None:
        out = e.op("mul", out, weight)
    return [out if bias is None else e.op("add", out, bias)]


@decomposes("gelu")
def _gelu(e: Emitter, inputs, attrs):
    (x,) = inputs
    if attrs["approximate"] == "tanh":
        cube = e.op("mul", e.op("mul", x, x), x)
        inner = e.op("add", x, e.op("mul", cube, e.const(0.044715, x.dtype)))
        t = e.op("tanh", e.op("mul", inner, e.const(math.sqrt(2 / math.pi), x.dtype)))
    else:
        t = e.op("erf", e.op("mul", x, e.const(math.sqrt(0.5), x.dtype)))
    half_x = e.op("mul", x, e.const(0.5, x.dtype))
    return [e.op("mul", half_x, e.op("add", t, e.const(1.0, x.dtype)))]


@decomposes("quick_gelu")
def _quick_gelu(e: Emitter, inputs, attrs):
    (x,) = inputs
    scaled = e.op("mul", x, e.const(float(attrs["alpha"]), x.dtype))
    return [e.op("mul", x, e.op("sigmoid", scaled))]


@decomposes("silu")
def _silu(e: Emitter, inputs, attrs):
    (x,) = inputs
    return [e.op("mul", x, e.op("sigmoid", x))]


def _repeat_heads(e: Emitter, x: Value, heads) -> Value:
    """repeat_kv: [b, hkv, s, d] -> [b, heads, s, d], kv head j // rep serving query head j."""
    b, hkv, s, d = x.shape
    rep = heads // hkv
    if rep == 1:
        return x
    x = e.op("reshape", x, shape=[b, hkv, 1, s, d])
    x = e.op("expand", x, shape=[b, hkv, rep, s, d])
    return e.op("reshape", x, shape=[b, heads, s, d])


@decomposes("scaled_dot_product_attention")
def _sdpa(e: Emitter, inputs, attrs):
    q, k, v, mask = inputs
    scale = attrs["scale"]
    if scale is None:  # checked before any node is built: a failed decomposition leaves none
        if not isinstance(q.shape[-1], int):
            raise ShapeError("attention without a scale needs a static head size")
        scale = 1.0 / math.sqrt(q.shape[-1])
    if attrs["enable_gqa"] and q.type.rank == 4:
        k, v = _repeat_heads(e, k, q.shape[1]), _repeat_heads(e, v, q.shape[1])
    perm = list(range(k.type.rank - 2)) + [k.type.rank - 1, k.type.rank - 2]
    scores = e.op("matmul", q, e.op("permute", k, dims=perm))
    scores = e.op("mul", scores, e.const(scale, q.dtype))
    if attrs["softcap"] is not None:  # softcap * tanh(scores / softcap), before the mask
        cap = e.const(float(attrs["softcap"]), q.dtype)
        scores = e.op("mul", e.op("tanh", e.op("div", scores, cap)), cap)
    if attrs["is_causal"]:
        ones = e.op("full", shape=[q.shape[-2], k.shape[-2]], value=True, dtype=DType.bool)
        if attrs["window"] is not None:  # keys i - window < j only
            ones = e.op("triu", ones, diagonal=1 - attrs["window"])
        mask = e.op("tril", ones, diagonal=0) if mask is None else mask
    if mask is not None and mask.dtype == DType.bool:
        neg_inf = e.const(float("-inf"), q.dtype)
        scores = e.op("where", mask, scores, neg_inf)
    elif mask is not None:
        scores = e.op("add", scores, mask)
    return [e.op("matmul", e.op("softmax", scores, dim=-1), v)]


@decomposes("rotary_embedding")
def _rotary(e: Emitter, inputs, attrs):
    x, cos, sin = inputs
    size = x.shape[-1]
    half = size // 2
    x1 = e.op("slice", x, dim=-1, start=0, end=half, step=1)
    x2 = e.op("slice", x, dim=-1, start=half, end=size, step=1)
    rotated = e.op("concat", e.op("neg", x2), x1, dim=-1)
    return [e.op("add", e.op("mul", x, cos), e.op("mul", rotated, sin))]


@decomposes("fused_linear")
def _fused_linear(e: Emitter, inputs, attrs):
    x, weight, bias = inputs
    if attrs["weight_layout"] == "out_in":
        out = e.op("linear", x, weight, bias)
    else:
        out = e.op("matmul", x, weight)
        out = out if bias is None else e.op("add", out, bias)
    return [e.activation(attrs["activation"], out)]


@decomposes("gated_mlp")
def _gated_mlp(e: Emitter, inputs, attrs):
    x, w_gate, w_up, w_down, b_gate, b_up, b_down = inputs
    gate = e.activation(attrs["activation"], e.op("linear", x, w_gate, b_gate))
    hidden = e.op("mul", gate, e.op("linear", x, w_up, b_up))
    return [e.op("linear", hidden, w_down, b_down)]


@decomposes("add_rms_norm")
def _add_rms_norm(e: Emitter, inputs, attrs):
    x, residual, weight = inputs
    total = e.op("add", x, residual)
    return [e.op("rms_norm", total, weight, **attrs), total]


@decomposes("add_layer_norm")
def _add_layer_norm(e: Emitter, inputs, attrs):
    x, residual, weight, bias = inputs
    total = e.op("add", x, residual)
    return [e.op("layer_norm", total, weight, bias, **attrs), total]
