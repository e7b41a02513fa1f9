"""Each op's shape rule (`infer`) agrees with what its torch reference produces.

A case gives operand types (dims may be symbolic) and attributes. The rule runs on the symbolic
types; its dims are then evaluated for concrete symbol values and compared with the shapes and
dtypes the op's `reference` gives on real tensors of those sizes. Symbolic cases run under two
bindings, so a rule that is right only by coincidence at one size still fails.
"""

from __future__ import annotations

import sys

import pytest
import sympy
import torch

from compiler.ir import OPS, DType, TensorType, get_op
from compiler.ir.ops import ShapeError
from compiler.ir.symbolic import evaluate, free_symbols, symbol

S0, S1 = symbol("s0"), symbol("s1")
BINDINGS = [{"s0": 5, "s1": 3}, {"s0": 8, "s1": 2}]
BIG = sys.maxsize  # what torch.export writes for an open slice end (`x[1:]`)


def T(dtype: str, *shape) -> TensorType:
    return TensorType(DType(dtype), shape)


def f32(*shape) -> TensorType:
    return T("f32", *shape)


def i64(*shape) -> TensorType:
    return T("i64", *shape)


def b(*shape) -> TensorType:
    return T("bool", *shape)


# (id, op, operand types (None = absent optional), attrs)
CASES = [
    # -- elementwise and broadcasting --
    ("add_broadcast", "add", [f32(2, 1, 4), f32(3, 1)], {}),
    ("add_sym_broadcast", "add", [f32(S0, 1), f32(1, 4)], {}),
    ("mul_scalar", "mul", [f32(), f32(2, 3)], {}),
    ("sub_rank_mismatch", "sub", [f32(4), f32(S0, 4)], {}),
    ("div_floor", "div", [f32(2, 3), f32(3)], {"rounding_mode": "floor"}),
    ("pow", "pow", [f32(2, 3), f32()], {}),
    ("maximum", "maximum", [f32(S0, 1, 2), f32(3, 1)], {}),
    ("remainder_int", "remainder", [i64(4, 2), i64(2)], {}),
    ("bitwise_and_i32", "bitwise_and", [T("i32", 3), T("i32", 2, 1)], {}),
    ("atan2", "atan2", [f32(3), f32(3)], {}),
    ("eq_bool_result", "eq", [f32(2, 3), f32(3)], {}),
    ("lt_sym", "lt", [i64(S0), i64(S1, 1)], {}),
    ("logical_and", "logical_and", [b(2, 3), b(1)], {}),
    ("where", "where", [b(2, 1), f32(1, 3), f32(2, 3)], {}),
    ("where_sym", "where", [b(S0, 1), f32(), f32(S1)], {}),
    ("exp", "exp", [f32(S0, 3)], {}),
    ("neg_int", "neg", [i64(2, 3)], {}),
    ("isnan", "isnan", [f32(2, 3)], {}),
    ("cast", "cast", [f32(2, 3)], {"dtype": DType.f16}),
    ("cast_to_bool", "cast", [i64(4)], {"dtype": DType.bool}),
    ("clamp", "clamp", [f32(2, 3)], {"min": -1.0, "max": 1.0}),
    ("clamp_one_side", "clamp", [f32(2, 3)], {"min": 0.0}),
    ("gelu_tanh", "gelu", [f32(4)], {"approximate": "tanh"}),
    ("softplus", "softplus", [f32(4)], {"beta": 2.0}),
    ("leaky_relu", "leaky_relu", [f32(4)], {"negative_slope": 0.2}),
    # -- reductions --
    ("sum_dim", "sum", [f32(2, 3, 4)], {"dims": [1]}),
    ("sum_keepdim", "sum", [f32(2, 3, 4)], {"dims": [1], "keepdim": True}),
    ("sum_all", "sum", [f32(2, 3, 4)], {}),
    ("sum_all_keepdim", "sum", [f32(2, 3, 4)], {"keepdim": True}),
    ("sum_negative_dims", "sum", [f32(2, 3, 4)], {"dims": [-1, 0], "keepdim": True}),
    ("sum_int", "sum", [T("i32", 2, 3)], {"dims": [1]}),
    ("sum_bool", "sum", [b(2, 3)], {}),
    ("mean_sym", "mean", [f32(S0, S1, 4)], {"dims": [-1], "keepdim": True}),
    ("amax", "amax", [f32(2, 3)], {"dims": [0]}),
    ("amin_int", "amin", [T("i32", 2, 3)], {"dims": [1]}),
    ("prod", "prod", [f32(2, 3, 4)], {"dims": [0, 2]}),
    ("any", "any", [b(2, 3)], {"dims": [1]}),
    ("all_keepdim", "all", [b(2, 3)], {"dims": [0], "keepdim": True}),
    ("var", "var", [f32(4, 5)], {"dims": [1], "correction": 0}),
    ("argmax", "argmax", [f32(2, 3)], {"dim": 1}),
    ("argmax_keepdim", "argmax", [f32(2, 3)], {"dim": 0, "keepdim": True}),
    ("argmax_flat", "argmax", [f32(2, 3)], {}),
    ("argmin_sym", "argmin", [f32(S0, 3)], {"dim": -1}),
    ("softmax", "softmax", [f32(S0, 4)], {"dim": 0}),
    ("log_softmax", "log_softmax", [f32(2, 4)], {}),
    ("cumsum", "cumsum", [f32(2, 4)], {"dim": 0}),
    ("cumsum_int", "cumsum", [T("i32", 2, 4)], {"dim": 1}),
    ("prod_int", "prod", [T("i32", 2, 4)], {"dims": [1]}),
    ("topk", "topk", [f32(4, 6)], {"k": 3}),
    ("topk_dim0_smallest", "topk", [f32(S0, 6)], {"k": 2, "dim": 0, "largest": False}),
    # -- matmul family --
    ("matmul_2d", "matmul", [f32(2, 3), f32(3, 4)], {}),
    ("matmul_vec_mat", "matmul", [f32(4), f32(4, 5)], {}),
    ("matmul_mat_vec", "matmul", [f32(3, 4), f32(4)], {}),
    ("matmul_dot", "matmul", [f32(4), f32(4)], {}),
    ("matmul_batch_broadcast", "matmul", [f32(2, 1, 3, 4), f32(5, 4, 6)], {}),
    ("matmul_sym_batch", "matmul", [f32(S0, 3, 4), f32(4, 2)], {}),
    ("matmul_vec_batch", "matmul", [f32(4), f32(S0, 4, 2)], {}),
    ("linear", "linear", [f32(S0, 8), f32(4, 8), f32(4)], {}),
    ("linear_no_bias", "linear", [f32(2, S0, 8), f32(4, 8), None], {}),
    # -- normalization, embedding --
    ("layer_norm", "layer_norm", [f32(2, S0, 8), f32(8), f32(8)], {"normalized_shape": [8]}),
    ("layer_norm_2d_no_affine", "layer_norm", [f32(2, 3, 4), None, None],
     {"normalized_shape": [3, 4]}),
    ("rms_norm", "rms_norm", [f32(S0, 8), f32(8)], {"normalized_shape": [8]}),
    ("group_norm", "group_norm", [f32(2, 4, 3, 3), f32(4), f32(4)], {"groups": 2}),
    ("batch_norm", "batch_norm", [f32(2, 4, 3), f32(4), f32(4), f32(4), f32(4)], {}),
    ("embedding", "embedding", [f32(10, 4), i64(2, S0)], {}),
    # -- convolution and pooling --
    ("conv1d", "conv", [f32(1, 2, 9), f32(4, 2, 3), f32(4)],
     {"stride": [2], "padding": [1], "dilation": [1]}),
    ("conv2d_groups_dilation", "conv", [f32(2, 4, 9, 8), f32(6, 2, 3, 2), None],
     {"stride": [2, 1], "padding": [1, 0], "dilation": [2, 1], "groups": 2}),
    ("conv2d_sym", "conv", [f32(1, 3, S0 + 6, 7), f32(2, 3, 3, 3), f32(2)],
     {"stride": [2, 2], "padding": [0, 1], "dilation": [1, 1]}),
    ("conv3d", "conv", [f32(1, 2, 5, 6, 7), f32(3, 2, 2, 3, 3), None],
     {"stride": [1, 2, 2], "padding": [1, 1, 0], "dilation": [1, 1, 1]}),
    ("max_pool2d", "max_pool", [f32(1, 2, 9, 8)],
     {"kernel": [3, 2], "stride": [2, 2], "padding": [1, 0], "dilation": [1, 1]}),
    ("max_pool2d_ceil", "max_pool", [f32(1, 2, 10, 7)],
     {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
      "ceil_mode": True}),
    ("max_pool1d_dilation", "max_pool", [f32(1, 2, 11)],
     {"kernel": [3], "stride": [1], "padding": [0], "dilation": [2]}),
    ("avg_pool2d", "avg_pool", [f32(1, 2, 7, 7)],
     {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "count_include_pad": False}),
    ("avg_pool2d_ceil", "avg_pool", [f32(1, 2, 8, 8)],
     {"kernel": [3, 3], "stride": [2, 2], "padding": [0, 0], "ceil_mode": True,
      "divisor_override": 2}),
    ("avg_pool1d", "avg_pool", [f32(2, 3, 10)], {"kernel": [4], "stride": [3], "padding": [2]}),
    ("adaptive_avg_pool2d", "adaptive_avg_pool", [f32(2, 3, 9, 7)], {"output_size": [2, 3]}),
    ("adaptive_avg_pool1d", "adaptive_avg_pool", [f32(2, 3, 9)], {"output_size": [4]}),
    # -- attention --
    ("sdpa", "scaled_dot_product_attention", [f32(2, 4, 5, 8), f32(2, 4, 6, 8), f32(2, 4, 6, 16),
                                              None], {}),
    ("sdpa_sym_mask", "scaled_dot_product_attention",
     [f32(1, 2, S0, 8), f32(1, 2, S0, 8), f32(1, 2, S0, 8), b(S0, S0)], {"scale": 0.5}),
    ("sdpa_causal_gqa", "scaled_dot_product_attention",
     [f32(1, 4, S0, 8), f32(1, 2, S0, 8), f32(1, 2, S0, 8), None],
     {"is_causal": True, "enable_gqa": True}),
    # -- views --
    ("reshape", "reshape", [f32(2, 3, 4)], {"shape": [6, 4]}),
    ("reshape_infer", "reshape", [f32(2, 3, 4)], {"shape": [-1, 2]}),
    ("reshape_sym", "reshape", [f32(S0, 2, 3)], {"shape": [2 * S0, 3]}),
    ("reshape_sym_infer", "reshape", [f32(S0, S1, 4)], {"shape": [S0, -1]}),
    ("permute", "permute", [f32(2, 3, 4)], {"dims": [2, 0, 1]}),
    ("permute_negative", "permute", [f32(S0, 3, 4)], {"dims": [-1, 0, 1]}),
    ("expand", "expand", [f32(3, 1)], {"shape": [2, 3, 4]}),
    ("expand_keep", "expand", [f32(S0, 1)], {"shape": [S0, 5]}),
    ("expand_minus_one", "expand", [f32(S0, 1)], {"shape": [2, -1, 4]}),
    ("slice_step", "slice", [f32(3, 10)], {"dim": 1, "start": 1, "end": 7, "step": 2}),
    ("slice_open_end", "slice", [f32(3, 10)], {"dim": 1, "start": 2, "end": BIG}),
    ("slice_negative", "slice", [f32(3, 10)], {"dim": -1, "start": -3, "end": -1}),
    ("slice_past_end", "slice", [f32(3, 10)], {"dim": 1, "start": 4, "end": 20, "step": 3}),
    ("slice_sym_end", "slice", [f32(2 * S0, 4)], {"dim": 0, "start": 1, "end": S0 + 1, "step": 2}),
    ("slice_sym_open_end", "slice", [f32(S0 + 3, 4)], {"dim": 0, "start": 2, "end": BIG}),
    ("slice_sym_negative_start", "slice", [f32(S0 + 3, 4)], {"dim": 0, "start": -2, "end": BIG}),
    ("slice_sym_negative_end", "slice", [f32(4, S0 + 3)], {"dim": 1, "start": 1, "end": -1}),
    # a symbolic start that counts from the end: XLM's mask[:, -slen:]
    ("slice_sym_from_the_end", "slice", [f32(1, 2 * S0, 4)], {"dim": 1, "start": -S0, "end": BIG}),
    ("slice_sym_from_the_end_to_zero", "slice", [f32(1, S0, 4)],
     {"dim": 1, "start": -S0, "end": 0}),
    ("select", "select", [f32(2, 3, 4)], {"dim": 1, "index": -1}),
    ("select_sym", "select", [f32(S0, 3)], {"dim": 0, "index": 0}),
    # -- data movement, indexing --
    ("concat", "concat", [f32(2, 3), f32(2, 1), f32(2, 4)], {"dim": -1}),
    ("concat_sym", "concat", [f32(S0, 3), f32(S1, 3), f32(2, 3)], {}),
    ("gather", "gather", [f32(3, 5), i64(3, 2)], {"dim": 1}),
    ("index_select", "index_select", [f32(3, 5, 2), i64(4)], {"dim": 1}),
    ("index_select_sym", "index_select", [f32(S0, 4), i64(S1)], {"dim": 0}),
    ("index_first", "index", [f32(4, 5), i64(3)], {}),
    ("index_middle", "index", [f32(4, 5, 6), None, i64(2, 3)], {}),
    ("index_adjacent_broadcast", "index", [f32(4, 5, 6, 7), None, i64(2, 1), i64(3)], {}),
    ("index_split", "index", [f32(4, 5, 6), i64(3), None, i64(3)], {}),
    ("index_sym", "index", [f32(S0, 5), i64(S1, 2)], {}),
    ("pad", "pad", [f32(2, 3, 4)], {"pads": [1, 2, 0, 3]}),
    ("pad_negative_value", "pad", [f32(2, 4)], {"pads": [-1, 2], "value": -1.5}),
    ("pad_sym", "pad", [f32(S0, 4)], {"pads": [0, 0, 1, 1]}),
    ("flip", "flip", [f32(2, 3)], {"dims": [0, 1]}),
    ("tril", "tril", [f32(S0, S0)], {"diagonal": 1}),
    ("triu", "triu", [f32(3, 4)], {"diagonal": -1}),
    ("repeat", "repeat", [f32(2, 3)], {"repeats": [2, 1, 3]}),
    ("repeat_sym", "repeat", [f32(S0, 3)], {"repeats": [2, 2]}),
    # -- creation --
    ("constant", "constant", [], {"value": 1.5, "dtype": DType.f32}),
    ("constant_int", "constant", [], {"value": 3, "dtype": DType.i64}),
    ("full", "full", [], {"shape": [2, 3], "value": 0.5, "dtype": DType.f32}),
    ("full_sym", "full", [], {"shape": [S0, S1 + 1], "value": True, "dtype": DType.bool}),
    ("arange", "arange", [], {"end": 7}),
    ("arange_step", "arange", [], {"start": 2, "end": 11, "step": 3}),
    ("arange_float", "arange", [], {"start": 0.0, "end": 1.0, "step": 0.3, "dtype": DType.f32}),
    ("arange_sym", "arange", [], {"end": S0}),
    ("arange_sym_start", "arange", [], {"start": 1, "end": 2 * S0, "step": 2}),
]


def _symbols(types, attrs) -> set[str]:
    names: set[str] = set()
    for t in types:
        for d in (t.shape if t is not None else ()):
            names |= free_symbols(d)
    for v in attrs.values():
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, sympy.Basic):
                names |= {s.name for s in item.free_symbols}
    return names


def _resolve(attr, bindings):
    if isinstance(attr, sympy.Basic):
        return evaluate(attr, bindings)
    if isinstance(attr, list):
        return [_resolve(a, bindings) for a in attr]
    return attr


def _tensor(t: TensorType, bindings, gen: torch.Generator) -> torch.Tensor:
    shape = [evaluate(d, bindings) for d in t.shape]
    dtype = t.dtype.to_torch()
    if t.dtype == DType.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if t.dtype.is_float:
        return torch.randn(shape, generator=gen).to(dtype)
    # integer operands double as indices, so keep them valid for every dim of size >= 2
    return torch.randint(0, 2, shape, generator=gen, dtype=dtype)


def _params():
    for case_id, op, types, attrs in CASES:
        symbolic = bool(_symbols(types, attrs))
        for n, bindings in enumerate(BINDINGS if symbolic else BINDINGS[:1]):
            suffix = f"-bind{n}" if symbolic else ""
            yield pytest.param(op, types, attrs, bindings, id=case_id + suffix)


@pytest.mark.parametrize("op, types, attrs, bindings", list(_params()))
def test_infer_matches_torch_reference(op, types, attrs, bindings):
    opdef = get_op(op)
    opdef.check_arity(len(types))
    full = opdef.complete_attrs(dict(attrs))
    inferred = opdef.infer(list(types), full)

    gen = torch.Generator().manual_seed(0)
    tensors = [None if t is None else _tensor(t, bindings, gen) for t in types]
    result = opdef.reference(*tensors, **{k: _resolve(v, bindings) for k, v in full.items()})
    results = list(result) if isinstance(result, (tuple, list)) else [result]

    assert len(inferred) == len(results), f"{op}: rule gives {len(inferred)} results"
    for want_type, got in zip(inferred, results):
        shape = [evaluate(d, bindings) for d in want_type.shape]
        assert shape == list(got.shape), f"{op}: rule {want_type} = {shape}, torch {got.shape}"
        assert DType.from_torch(got.dtype) == want_type.dtype, f"{op}: torch dtype {got.dtype}"


@pytest.mark.parametrize("op, types, attrs, message", [
    ("add", [f32(2, 3), f32(4, 3)], {}, "cannot broadcast 2 with 4"),
    ("add", [f32(2), i64(2)], {}, "one dtype"),
    ("matmul", [f32(2, 3), f32(4, 5)], {}, "contraction mismatch"),
    ("matmul", [f32(), f32(3)], {}, "rank >= 1"),
    ("linear", [f32(2, 3), f32(4, 5), None], {}, "input features"),
    ("linear", [f32(2, 3), f32(4, 3), f32(5)], {}, "bias"),
    ("where", [f32(2), f32(2), f32(2)], {}, "bool condition"),
    ("reshape", [f32(2, 3)], {"shape": [4, 2]}, "element count"),
    ("permute", [f32(2, 3)], {"dims": [0, 0]}, "not a permutation"),
    ("expand", [f32(2, 3)], {"shape": [4, 3]}, "not 1"),
    ("select", [f32(2, 3)], {"dim": 2, "index": 0}, "out of range"),
    ("concat", [f32(2), i64(2)], {}, "one dtype"),
    ("layer_norm", [f32(2, 3), None, None], {"normalized_shape": [4]}, "does not end"),
    ("conv", [f32(1, 2, 5), f32(3, 2, 2, 2), None],
     {"stride": [1], "padding": [0], "dilation": [1]}, "rank"),
    ("scaled_dot_product_attention", [f32(1, 4, 8), f32(1, 4, 6), f32(1, 4, 8), None], {},
     "head size"),
    ("index", [f32(2, 3), None], {}, "at least one index"),
])
def test_infer_rejects_bad_operands(op, types, attrs, message):
    opdef = get_op(op)
    with pytest.raises(ShapeError, match=message):
        opdef.infer(list(types), opdef.complete_attrs(dict(attrs)))


# cast needs a dtype and clamp a bound; both have cases above
UNARY = sorted(name for name, opdef in OPS.items() if opdef.kind == "elementwise"
               and opdef.inputs == ("x",) and name not in ("cast", "clamp"))


@pytest.mark.parametrize("op", UNARY)
def test_unary_elementwise_rule_matches_torch(op):
    t = i64(S0, 3) if op.startswith("bitwise") else f32(S0, 3)
    test_infer_matches_torch_reference(op, [t], {}, BINDINGS[0])
