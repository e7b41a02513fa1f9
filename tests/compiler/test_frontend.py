"""The torch.export frontend: numerics against eager, symbols, names, locations and errors.

Every exported graph is also printed, parsed back and printed again (exact round trip), checked
for a `loc` on every node, and run with the reference interpreter against torch eager (fp32,
1e-5) by `check`.
"""

from __future__ import annotations

import re

import pytest
import sympy
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.export import Dim

import compiler
from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.frontend import ConversionError, UnsupportedOpsError
from compiler.frontend.symbols import SymbolMap
from compiler.ir import parse_ir, print_ir

THIS_FILE = "test_frontend.py"


class Fn(torch.nn.Module):
    """A module around a function, so single ops can be exported."""

    def __init__(self, fn, *modules: torch.nn.Module):
        super().__init__()
        self.fn = fn
        self.mods = torch.nn.ModuleList(modules)

    def forward(self, *xs):
        return self.fn(self.mods, *xs)


class One(torch.nn.Module):
    """A one-input module around a function, for tests that give dynamic_shapes."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def check(model, inputs: tuple, dynamic_shapes=None, runs: list[tuple] | None = None,
          atol: float = 1e-5):
    """Export once, check text round trip and locs, compare with eager on every run."""
    graph = compiler.export(model, inputs, dynamic_shapes)
    text = print_ir(graph)
    assert print_ir(parse_ir(text)) == text
    assert all(node.loc and re.match(r".+:\d+$", node.loc) for node in graph.nodes)
    model.eval()
    for args in runs or [inputs]:
        with torch.no_grad():
            expected = [x for x in pytree.tree_leaves(model(*args)) if isinstance(x, torch.Tensor)]
        got = run_graph(graph, graph.weight_data, list(args))
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, atol=atol, rtol=atol)
    return graph


def ops_of(graph) -> list[str]:
    return [node.op for node in graph.nodes]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


x34, x234 = torch.randn(3, 4), torch.randn(2, 3, 4)
ints = torch.arange(12).reshape(3, 4)
img = torch.randn(2, 4, 9, 9)

ELEMENTWISE = {
    "unary": (lambda m, x: torch.exp(x).tanh() + x.abs().sqrt() - torch.sigmoid(x).rsqrt(), (x34,)),
    "activations": (lambda m, x: F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x) + F.relu(x)
                    + F.leaky_relu(x, 0.2) + F.hardswish(x) + F.softplus(x) + F.elu(x), (x34,)),
    "clamp": (lambda m, x: x.clamp(-0.5, 0.5) + F.hardtanh(x) + F.relu6(x) + x.clamp(min=0.1),
              (x34,)),
    "clamp_tensor": (lambda m, x, y: torch.clamp(x, min=y), (x34, torch.randn(4))),
    "int_float_promotion": (lambda m, i, x: i + x * 2 + i / 3 + (i // 2) + i * 1.5, (ints, x34)),
    "bool_and_compare": (lambda m, i, x: ((i > 3) & (x < 0.5)) | (i == 2.0), (ints, x34)),
    "pow_and_rsub": (lambda m, x: x.pow(2) + 2 ** x + (1 - x) + torch.pow(x.abs(), x), (x34,)),
    "where_masked_fill": (lambda m, x: torch.where(x > 0, x, 0.0).masked_fill(x < -1, -5.0),
                          (x34,)),
    "add_alpha": (lambda m, x, y: torch.add(x, y, alpha=3) - torch.sub(x, y, alpha=0.5),
                  (x34, x34)),
    "cast": (lambda m, x: x.to(torch.int64) + x.to(torch.float16).to(torch.float32).round().long(),
             (x34 * 10,)),
    "remainder_fmod": (lambda m, x: torch.remainder(x, 0.7) + torch.fmod(x, 0.3), (x34,)),
}
REDUCTIONS = {
    "sum_mean": (lambda m, x: x.sum() + x.mean(-1).sum() + x.sum((0, 2), keepdim=True).mean(),
                 (x234,)),
    "max_min_arg": (lambda m, x: (x.amax(1), x.max(dim=-1), x.min(0).values, x.argmax(),
                                  x.argmin(1, keepdim=True)), (x234,)),
    "var_std": (lambda m, x: (x.var(-1), x.std(0, correction=0), torch.var_mean(x, 1)), (x234,)),
    "softmax": (lambda m, x: F.softmax(x, -1) + F.log_softmax(x, 1), (x234,)),
    "cumsum_topk": (lambda m, x: (x.cumsum(1), torch.topk(x, 2, dim=-1)), (x234,)),
    # MoE routers count tokens per expert in int32; the IR sums in i64 and casts (same wrap)
    "cumsum_int32": (lambda m, i: (torch.cumsum(i, dim=0, dtype=torch.int32),
                                   torch.cumsum(i > 1, dim=-1)), (ints,)),
    "any_all_bool_sum": (lambda m, x: ((x > 0).any(-1), (x > -3).all(), (x > 0).sum(1)), (x234,)),
}
NN = {
    "linear": (lambda m, x: m[1](m[0](x)), (x234,), torch.nn.Linear(4, 6),
               torch.nn.Linear(6, 2, bias=False)),
    "matmul_bmm_addmm": (lambda m, a, b: (a @ b, torch.bmm(a, b),
                                          torch.addmm(b[0, 0], a[0], b[0], beta=0.5, alpha=2)),
                         (torch.randn(2, 3, 4), torch.randn(2, 4, 5))),
    "norms": (lambda m, x: m[1](m[0](x)) + m[2](x), (x234,), torch.nn.LayerNorm(4),
              torch.nn.RMSNorm(4, eps=1e-6), torch.nn.RMSNorm([3, 4])),
    "group_batch_norm": (lambda m, x: m[1](m[0](x)), (img,), torch.nn.GroupNorm(2, 4),
                         torch.nn.BatchNorm2d(4)),
    "embedding": (lambda m, i: m[0](i), (ints,), torch.nn.Embedding(12, 5)),
    "conv": (lambda m, x: m[1](m[0](x)), (img,), torch.nn.Conv2d(4, 6, 3, stride=2, padding=1),
             torch.nn.Conv2d(6, 6, 3, groups=3, dilation=2, padding="same")),
    "conv1d": (lambda m, x: m[0](x), (torch.randn(2, 4, 11),), torch.nn.Conv1d(4, 3, 3)),
    "conv_unbatched": (lambda m, x: m[0](x).flatten(1), (img[0],),
                       torch.nn.Conv2d(4, 2, 3, padding=(1, 0), dilation=(1, 2))),
    "conv_padding_modes": (lambda m, x: (m[0](x), m[1](x), m[2](x[0])), (img,),
                           torch.nn.Conv2d(4, 3, (4, 3), padding="same", dilation=(1, 2)),
                           torch.nn.Conv2d(4, 2, 2, padding="valid"),
                           torch.nn.Conv2d(4, 2, 2, padding="same")),
    "pooling": (lambda m, x: (F.max_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 2, ceil_mode=True),
                              F.adaptive_avg_pool2d(x, (3, 1)), F.max_pool1d(x[0], 2),
                              F.avg_pool1d(x[0], 3, count_include_pad=False, padding=1)), (img,)),
    "sdpa": (lambda m, q, k, v, mask: (F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                       F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                       F.scaled_dot_product_attention(q, k[:, :2], v[:, :2],
                                                                      enable_gqa=True)),
             (torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8),
              torch.rand(5, 5) > 0.3)),
}
SHAPES = {
    "views": (lambda m, x: (x.view(-1, 4), x.reshape(2, 12).t(), x.unsqueeze(1).squeeze(),
                            x.flatten(1), x.transpose(0, 2), x.permute(2, 0, 1)), (x234,)),
    "slice_select": (lambda m, x: (x[:, 1:], x[..., -2:], x[-1], x[:, ::2, 1], x.narrow(2, 1, 2)),
                     (x234,)),
    "expand_repeat": (lambda m, x: (x[:, :1].expand(2, 5, 4), x.repeat(1, 2, 1),
                                    x.expand_as(torch.empty(3, 2, 3, 4))), (x234,)),
    "cat_stack_split": (lambda m, x, i: (torch.cat([x, i.float()[None]], 0), torch.stack([x, x], 1),
                                         x.split([1, 3], -1), x.chunk(2, 0), x.unbind(1)),
                        (x234, ints)),
    "gather_index": (lambda m, x, i: (torch.gather(x, 1, i), x.index_select(2, i[0, 0]),
                                      x[i[0, :, 0], :, i[1, :, 1]], x[:, i[0]]),
                     (x234, torch.randint(0, 2, (2, 3, 4)))),
    "pad_flip_tri": (lambda m, x: (F.pad(x, (1, 2, 0, 1), value=0.5), x.flip(-1),
                                   x.tril(), x.triu(1), x.roll(1, -1)), (x234,)),
    "creation": (lambda m, x: (torch.zeros(3, 4) + torch.ones_like(x[0]) + torch.full((3,), 2.0)
                               .unsqueeze(-1), torch.arange(4) * x.new_ones(()).long(),
                               torch.tensor([1.0, 2.0, 3.0, 4.0]) * x, torch.arange(0.5, 3.0, 0.5)),
                 (x234,)),
    "identities": (lambda m, x: x.clone().contiguous().detach() + F.dropout(x, 0.5, False),
                   (x234,)),
}


def _assign(m, x, mask, y):
    x = x.clone()
    x[:, 1:3] = y
    x[0] = 5.0
    x[mask] = -1.0
    x[:, -2:] += 0.5
    return x


SHAPES["inplace_assign"] = (_assign, (x34.clone(), x34 > 0.3, torch.randn(3, 2)))
CASES = {**ELEMENTWISE, **REDUCTIONS, **NN, **SHAPES}


@pytest.mark.parametrize("name", CASES)
def test_op_family(name):
    fn, inputs, *modules = CASES[name]
    check(Fn(fn, *modules), inputs)


def test_vision_stem_converts_without_torch_decompositions():
    # conv2d and flatten come straight from torch.export's training IR: no run_decompositions
    from compiler.frontend.decompositions import decompose

    stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.Flatten(2),
                               torch.nn.Conv1d(8, 8, 2, padding="same"))
    program = torch.export.export(stem.eval(), (torch.randn(1, 3, 16, 16),))
    assert decompose(program) is program
    check(stem, (torch.randn(1, 3, 16, 16),))


def test_casts_inserted_where_torch_promotes():
    graph = check(Fn(lambda m, i, x: i + x), (ints, x34))
    cast = next(n for n in graph.nodes if n.op == "cast")
    assert cast.inputs[0] is graph.inputs[0] and cast.attrs["dtype"].value == "f32"
    add = next(n for n in graph.nodes if n.op == "add")
    assert {v.dtype.value for v in add.inputs} == {"f32"}


def test_scalars_become_typed_constants():
    graph = check(Fn(lambda m, x, i: (x * 2, i + 3)), (x34, ints))
    constants = {(n.attrs["value"], n.attrs["dtype"].value) for n in graph.nodes
                 if n.op == "constant"}
    assert constants == {(2.0, "f32"), (3, "i64")}


class Attention(torch.nn.Module):
    """Sizes read from the input drive reshape, arange and slicing: all must stay symbolic."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
        pos = torch.arange(s, dtype=torch.float32)[None, None, :, None]
        out = F.scaled_dot_product_attention(q + pos, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(b, s, 16)
        return out[:, 1:].reshape(b, s * 4 - 4, 4), out[:, -1]


def test_dynamic_shapes_one_export_many_sizes():
    seq = Dim("seq", min=4, max=64)
    runs = [(torch.randn(2, n, 16),) for n in (4, 5, 17, 64)]
    graph = check(Attention(), (torch.randn(2, 8, 16),), dynamic_shapes=({1: seq},), runs=runs)
    assert graph.symbols == {"s0": (4, 64)}
    assert str(graph.inputs[0].type) == "f32[2, s0, 16]"
    text = print_ir(graph)
    assert "shape=[2, s0, 3, 2, 8]" in text
    assert "shape=[2, 4*s0 - 4, 4]" in text
    assert not any(op.startswith("sym") for op in ops_of(graph))


@pytest.mark.parametrize("fn,lo", [
    (lambda x: x[:, -x.shape[1]:] * 2, 2),  # XLM's mask[:, -slen:]: the whole dim, never empty
    (lambda x: x[:, 1 - x.shape[1]:] * 2, 3),
    (lambda x: x[:, -3:] * 2, 4),  # a count from the end of a dynamic dim
    (lambda x: x.select(1, -1) * 2, 2),
], ids=["minus_size", "one_minus_size", "last_three", "select_last"])
def test_indices_from_the_end_of_a_dynamic_dim(fn, lo):
    runs = [(torch.randn(1, n, 4),) for n in (lo, 5, 9)]
    check(One(fn), runs[1], dynamic_shapes=({1: Dim("seq", min=lo, max=16)},), runs=runs)


@pytest.mark.parametrize("fn", [
    # MPT's ALiBi bias[:, max(0, 128 - seq):]: Max(0, 128 - s0), decided by seq <= 64
    lambda x: torch.arange(128.0).expand(1, 128)[:, max(0, 128 - x.shape[1]):] * x[:, :, 0],
    lambda x: x[:, max(0, 1 - x.shape[1]):] * 2,  # Max(0, 1 - s0) = 0
], ids=["max_from_the_end", "max_zero"])  # (torch.export refuses min() of a size itself)
def test_slice_starts_with_max_and_min_decided_by_the_range(fn):
    runs = [(torch.randn(1, n, 4),) for n in (2, 5, 64)]
    graph = check(One(fn), runs[1], dynamic_shapes=({1: Dim("seq", min=2, max=64)},), runs=runs)
    assert "Max" not in print_ir(graph) and "Min" not in print_ir(graph)


def test_extrema_the_range_does_not_decide_stay():
    from compiler.frontend.aten.shape import decide_extrema

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert decide_extrema(sympy.Max(0, 128 - s0), {"s0": (2, 64)}) == 128 - s0
    assert decide_extrema(sympy.Max(0, 128 - s0), {"s0": (2, 200)}) == sympy.Max(0, 128 - s0)
    assert decide_extrema(sympy.Min(s0, 8) + 1, {"s0": (2, 6)}) == s0 + 1


def test_slice_start_before_a_static_dim_is_clamped_to_zero():
    graph = check(One(lambda x: x[:, -7:] * 2), (torch.randn(1, 5, 4),))
    assert any(n.op == "slice" and n.attrs["start"] == 0 for n in graph.nodes) or \
        "slice" not in ops_of(graph)


def test_unbounded_dim_has_no_upper_bound():
    graph = check(One(lambda x: x.sum(0)), (x234,), dynamic_shapes=({0: Dim("b")},))
    assert graph.symbols["s0"][1] is None
    assert "symbol s0 in [" in print_ir(graph) and ", inf]" in print_ir(graph)


def test_symbol_conversion_of_torch_functions():
    from torch.utils._sympy.functions import CeilDiv, FloorDiv, Max, Min, PythonMod

    s70, s3 = sympy.Symbol("s70", integer=True, positive=True), sympy.Symbol("s3", integer=True)
    symbols = SymbolMap()
    assert symbols.declare(s70) == "s0" and symbols.declare(s3) == "s1"
    assert str(symbols.expr(FloorDiv(s70, 2))) == "floor(s0/2)"
    assert str(symbols.expr(PythonMod(s70, 4) + 1)) == "Mod(s0, 4) + 1"
    assert str(symbols.expr(CeilDiv(s70, s3))) == "floor((s0 + s1 - 1)/s1)"  # torch's own form
    assert str(symbols.expr(Max(s70, s3 * 2))) == "Max(s0, 2*s1)"
    assert str(symbols.expr(Min(s70, 7))) == "Min(7, s0)"
    assert symbols.expr(sympy.Integer(5)) == 5 and isinstance(symbols.expr(sympy.Integer(5)), int)


class Named(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, tokens, mask):
        h = self.proj(tokens) * self.scale + torch.tensor([1.0, 0.0, 0.0, 1.0])
        return {"hidden": h, "pair": (h.sum(-1), mask.float())}


def test_names_of_inputs_weights_and_outputs():
    graph = check(Named(), (x34, ints > 3))
    assert [v.name for v in graph.inputs] == ["tokens", "mask"]
    assert {"proj.weight", "proj.bias", "scale"} <= set(graph.weights)
    assert set(graph.weights) == set(graph.weight_data)
    assert torch.equal(graph.weight_data["scale"], torch.full((4,), 2.0))
    assert [v.name for v in graph.outputs] == ["hidden", "pair_0", "pair_1"]
    single = check(Fn(lambda m, x: x + 1), (x34,))
    assert [v.name for v in single.outputs] == ["out"]
    pair = check(Fn(lambda m, x: (x + 1, x * 2)), (x34,))
    assert [v.name for v in pair.outputs] == ["out0", "out1"]


def line_of(text: str) -> int:
    with open(__file__) as source:
        return next(i for i, line in enumerate(source, 1) if text in line)


def test_every_node_points_at_the_user_line():
    graph = check(Named(), (x34, ints > 3))
    line = line_of("h = self.proj(tokens)")  # the return statement follows it
    assert {node.loc.split("compiler/")[-1] for node in graph.nodes} == {
        f"{THIS_FILE}:{line}", f"{THIS_FILE}:{line + 1}"}


class ManyUnsupported(torch.nn.Module):
    def forward(self, x):
        a = torch.cummax(x, -1).values
        b = torch.cummax(a + 1, -1).values
        c = torch.special.bessel_j0(b)
        return F.conv_transpose1d(c, torch.ones(4, 2, 3)).cumprod(-1)


def test_unsupported_ops_are_listed_all_at_once():
    with pytest.raises(UnsupportedOpsError) as info:
        compiler.export(ManyUnsupported(), (torch.randn(1, 4, 6),))
    err = info.value
    assert err.ops == {"aten.cummax.default": 2, "aten.special_bessel_j0.default": 1,
                       "aten.convolution.default (transposed convolution)": 1,
                       "aten.cumprod.default": 1}
    text = str(err)
    assert f"{THIS_FILE}:{line_of('a = torch.cummax(x')} (a = torch.cummax(x, -1).values)" in text
    assert "x2" in text and "fix:" in text and "decomposition" in text


def test_torch_export_failures_become_dayzero_errors():
    branchy = Fn(lambda m, x: x * 2 if x.sum() > 0 else x)
    with pytest.raises(DayzeroError, match="torch.export could not trace") as info:
        compiler.export(branchy, (x34,))
    assert "data-dependent" in str(info.value) and THIS_FILE in info.value.where
    with pytest.raises(DayzeroError, match="Constraints violated"):
        compiler.export(One(lambda x: x.view(2, 16)), (torch.randn(2, 4, 4),),
                        dynamic_shapes=({1: Dim("a")},))
    with pytest.raises(DayzeroError, match="example_inputs must be a tuple"):
        compiler.export(Fn(lambda m, x: x), x34)
    with pytest.raises(DayzeroError, match="nn.Module"):
        compiler.export(lambda x: x, (x34,))


def test_type_mismatch_is_an_internal_error(monkeypatch):
    from compiler.frontend.aten import CONVERTERS

    monkeypatch.setitem(CONVERTERS, "aten.relu.default",
                        lambda em, a: em.op("sum", a["self"], dims=[0]))
    with pytest.raises(ConversionError, match=r"aten.relu.default \(converter error: IR value "
                       r"%relu has type f32\[4\] but torch computed f32\[3, 4\]\) +x1 +first at "
                       r".*test_frontend.py:\d+"):
        compiler.export(Fn(lambda m, x: torch.relu(x)), (x34,))


class TwoDataDependentSizes(torch.nn.Module):
    def forward(self, x):
        rows = torch.nonzero(x > 0)[:, 0]  # one data-dependent size (u0), needed by four ops
        cols = torch.nonzero(x < 0)[:, 1]  # and another
        return (x[rows] * 2 + 1).exp().sum(0), (x[:, cols] - 1).relu()


def test_a_data_dependent_size_is_reported_once_with_the_op_that_makes_it():
    with pytest.raises(UnsupportedOpsError) as info:
        compiler.export(TwoDataDependentSizes(), (torch.randn(4, 3),))
    assert list(info.value.ops) == ["aten.nonzero.default"]
    assert "1 problem(s)" in info.value.what and "needed by aten.sym_size.int" in info.value.what


class MaskedLayer(torch.nn.Module):
    def forward(self, x):
        return x + x[x > 0].sum()  # boolean-mask indexing: a data-dependent size per call


class MaskedLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(MaskedLayer() for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_one_line_run_by_every_layer_is_one_problem_with_its_occurrences():
    """Four layers run the same unsupported line: one problem seen 4 times, not one for the
    first layer plus a data-dependent size for each later one."""
    with pytest.raises(UnsupportedOpsError) as info:
        compiler.export(MaskedLayers(), (x34,))
    assert len(info.value.ops) == 1 and "1 problem(s)" in info.value.what
    assert next(iter(info.value.ops)).startswith("aten.index.Tensor (boolean-mask indexing")
    line = line_of("return x + x[x > 0].sum()")
    assert re.search(rf"4 times, first at \S*{THIS_FILE}:{line} ", info.value.what)


def test_failed_converters_are_collected_with_the_missing_ops(monkeypatch):
    """A converter bug stays an internal error, but it no longer hides what else is missing:
    every failure and every missing op comes out in one message (and in coverage's table)."""
    from compiler.frontend.aten import CONVERTERS
    from compiler.tools.partial_export import export_partial

    def broken(em, a):
        raise TypeError("a bug")

    monkeypatch.setitem(CONVERTERS, "aten.relu.default", broken)
    monkeypatch.delitem(CONVERTERS, "aten.exp.default")
    model = Fn(lambda m, x: (torch.relu(x), torch.relu(x + 1), torch.exp(x)))
    with pytest.raises(ConversionError) as info:
        compiler.export(model, (x34,))
    head, error, also, missing_row = str(info.value).splitlines()
    assert head.startswith("1 converter failure(s) on 2 node(s): an internal error")
    assert re.match(r"  aten.relu.default \(converter error: TypeError: a bug\)  x2 +2 times, "
                    r"first at .*test_frontend.py:\d+", error)
    assert also.startswith("also missing") and missing_row.split()[:2] == ["aten.exp.default", "x1"]
    missing = {m.name: m.count for m in export_partial(model, (x34,)).missing}
    assert missing == {"aten.exp.default": 1,
                       "aten.relu.default (converter error: TypeError: a bug)": 2}


def test_training_modes_are_restored():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    model[0].eval()
    graph = compiler.export(model, (x34,))
    assert ops_of(graph) == ["linear"]
    assert model.training and model[1].training and not model[0].training


def test_ops_doc_is_in_sync():
    from compiler.frontend import opdoc

    assert opdoc.main(["--check"]) == 0, "run python -m compiler.frontend.opdoc"


# -- transformers models: tiny configs, random weights, built from config -----------------------
def _llama(impl):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=512, use_cache=False,
        attn_implementation=impl))


def _gpt2(impl):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=512, use_cache=False,
        bos_token_id=0, eos_token_id=0, attn_implementation=impl))


def _bert(impl):
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        vocab_size=128, max_position_embeddings=512, attn_implementation=impl))


def _vit(impl):
    from transformers import ViTConfig, ViTModel

    return ViTModel(ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, attn_implementation=impl))


TEXT_MODELS = {"llama": _llama, "gpt2": _gpt2, "bert": _bert}


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", TEXT_MODELS)
def test_transformers_text_model_dynamic_sequence(name, impl):
    pytest.importorskip("transformers")
    model = TEXT_MODELS[name](impl).eval()
    runs = [(torch.randint(0, 128, (1, n)),) for n in (7, 64, 300)]
    graph = check(model, (torch.randint(0, 128, (1, 16)),),
                  dynamic_shapes=({1: Dim("seq", min=2, max=512)},), runs=runs)
    assert graph.symbols == {"s0": (2, 512)}
    assert any(n.op == "linear" for n in graph.nodes)
    attention = "scaled_dot_product_attention" if impl == "sdpa" else "softmax"
    assert attention in ops_of(graph)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_transformers_vit_dynamic_batch(impl):
    pytest.importorskip("transformers")
    runs = [(torch.randn(n, 3, 32, 32),) for n in (1, 3, 5)]
    graph = check(_vit(impl).eval(), (torch.randn(2, 3, 32, 32),),
                  dynamic_shapes=({0: Dim("batch", max=16)},), runs=runs)
    assert "conv" in ops_of(graph) and "layer_norm" in ops_of(graph)


class WithMask(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def _padded(n: int):
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, :3] = 0  # left padding in the second row
    return torch.randint(0, 128, (2, n)), mask


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "bert"])
def test_transformers_padding_mask(name):
    pytest.importorskip("transformers")
    model = WithMask(TEXT_MODELS[name]("sdpa").eval())
    seq = Dim("seq", min=4, max=512)
    check(model, _padded(16), dynamic_shapes=({1: seq}, {1: seq}),
          runs=[_padded(n) for n in (7, 64, 300)])
