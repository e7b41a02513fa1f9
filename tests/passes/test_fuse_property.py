"""Property: fusion never changes results. Random graphs of elementwise and reduction ops, mixed
with the decomposed forms the patterns look for (RMSNorm, LayerNorm, GELU, SiLU), whose pieces
later random ops may also read (so some must be refused), compute the same values after
`fuse,fuse_groups` as before, and the fused graph prints and parses back."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, TensorType, parse_ir, print_ir, verify
from passes import PassManager

B, D = 3, 8
F32 = DType.f32
UNARY = ["neg", "tanh", "sigmoid", "abs", "sin", "relu", "silu", "gelu"]
BINARY = ["add", "sub", "mul", "maximum"]
REDUCE = ["sum", "mean", "amax"]


class Builder:
    def __init__(self):
        self.g = Graph("random")
        self.pool = [self.g.add_input("x", TensorType(F32, (B, D))),
                     self.g.add_input("y", TensorType(F32, (B, D)))]
        self.w = self.g.add_input("w", TensorType(F32, (D,)))

    def op(self, name, *inputs, **attrs):
        return self.g.add_node(name, inputs, attrs).output

    def const(self, value):
        return self.op("constant", value=value, dtype=F32)

    def full(self):
        return [v for v in self.pool if v.shape == (B, D)]


def rms_norm(b: Builder, x):
    ms = b.op("mean", b.op("mul", x, x), dims=[-1], keepdim=True)
    r = b.op("rsqrt", b.op("add", ms, b.const(1e-6)))
    return [ms, b.op("mul", b.w, b.op("mul", x, r))]


def layer_norm(b: Builder, x):
    d = b.op("sub", x, b.op("mean", x, dims=[-1], keepdim=True))
    var = b.op("mean", b.op("pow", d, b.const(2.0)), dims=[-1], keepdim=True)
    return [d, b.op("div", d, b.op("sqrt", b.op("add", var, b.const(1e-5))))]


def gelu_tanh(b: Builder, x):
    cube = b.op("mul", b.op("mul", x, x), x)
    inner = b.op("mul", b.op("add", x, b.op("mul", cube, b.const(0.044715))),
                 b.const(math.sqrt(2 / math.pi)))
    return [b.op("mul", b.op("mul", x, b.const(0.5)),
                 b.op("add", b.op("tanh", inner), b.const(1.0)))]


def silu(b: Builder, x):
    return [b.op("mul", b.op("sigmoid", x), x)]


MOTIFS = [rms_norm, layer_norm, gelu_tanh, silu]


@st.composite
def graphs(draw) -> str:
    b = Builder()
    for _ in range(draw(st.integers(2, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "softmax", "motif", "motif"]))
        if kind == "unary":
            out = [b.op(draw(st.sampled_from(UNARY)), draw(st.sampled_from(b.pool)))]
        elif kind == "binary":
            out = [b.op(draw(st.sampled_from(BINARY)), draw(st.sampled_from(b.pool)),
                        draw(st.sampled_from(b.pool)))]
        elif kind == "reduce":
            out = [b.op(draw(st.sampled_from(REDUCE)), draw(st.sampled_from(b.full())),
                        dims=[-1], keepdim=True)]
        elif kind == "softmax":
            out = [b.op("softmax", draw(st.sampled_from(b.full())), dim=-1)]
        else:
            out = draw(st.sampled_from(MOTIFS))(b, draw(st.sampled_from(b.full())))
        b.pool.extend(out)
    returned = [b.pool[-1]] + draw(st.lists(st.sampled_from(b.pool[2:]), max_size=2,
                                            unique_by=id))
    b.g.outputs = returned
    verify(b.g)
    return print_ir(b.g)


@given(graphs(), st.integers(0, 2**16))
def test_fusion_never_changes_results(text, seed):
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(B, D, generator=gen), torch.randn(B, D, generator=gen),
              torch.randn(D, generator=gen)]
    want = run_graph(parse_ir(text), {}, inputs)
    manager = PassManager("fuse,fuse_groups")
    graph = manager.run(parse_ir(text))
    fused_text = print_ir(graph)
    assert print_ir(parse_ir(fused_text)) == fused_text
    got = run_graph(parse_ir(fused_text), {}, inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_every_motif_is_one_the_patterns_recognise():
    b = Builder()
    b.g.outputs = [fn(b, b.pool[0])[-1] for fn in MOTIFS]
    manager = PassManager("fuse")
    graph = manager.run(parse_ir(print_ir(b.g)))
    assert sorted(r.rule for r in manager.passes[0].records()) == [
        "gelu_tanh", "layer_norm", "rms_norm", "rms_norm_weight", "silu"]
    assert sorted(n.op for n in graph.nodes) == ["gelu", "layer_norm", "rms_norm", "silu"]
