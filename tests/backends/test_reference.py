"""The reference backend: capabilities, empty payload, and hand-built graphs against torch eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import backends
import runtime
from backends.reference import ReferenceBackend, check_weights
from compiler.errors import ArtifactError, DayzeroError
from compiler.ir import OPS, DType, Graph, TensorType, symbol
from compiler.writer import write_artifact

S0 = symbol("s0")
HEADS, HEAD, DIM = 2, 4, 8


def weight(g: Graph, name: str, *shape: int, seed: int):
    data = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.5
    return g.add_weight(name, TensorType(DType.f32, shape), data)


def attention_block() -> Graph:
    """Pre-norm self-attention with a symbolic sequence length and a GELU MLP, residuals."""
    g = Graph()
    g.symbols["s0"] = (2, 32)
    x = g.add_input("x", TensorType(DType.f32, (1, S0, DIM)))
    ln_w, ln_b = weight(g, "ln_w", DIM, seed=1), weight(g, "ln_b", DIM, seed=2)
    h = g.add_node("layer_norm", [x, ln_w, ln_b], {"normalized_shape": [DIM]}).output

    def heads(name, seed):
        proj = g.add_node("linear", [h, weight(g, name, DIM, DIM, seed=seed), None]).output
        split = g.add_node("reshape", [proj], {"shape": [1, S0, HEADS, HEAD]}).output
        return g.add_node("permute", [split], {"dims": [0, 2, 1, 3]}).output

    q, k, v = heads("wq", 3), heads("wk", 4), heads("wv", 5)
    a = g.add_node("scaled_dot_product_attention", [q, k, v, None], {"is_causal": True}).output
    a = g.add_node("permute", [a], {"dims": [0, 2, 1, 3]}).output
    a = g.add_node("reshape", [a], {"shape": [1, S0, DIM]}).output
    a = g.add_node("linear", [a, weight(g, "wo", DIM, DIM, seed=6), None]).output
    r = g.add_node("add", [x, a]).output
    m = g.add_node("linear", [r, weight(g, "w1", 16, DIM, seed=7), weight(g, "b1", 16, seed=8)])
    m = g.add_node("gelu", [m.output], {"approximate": "tanh"}).output
    m = g.add_node("linear", [m, weight(g, "w2", DIM, 16, seed=9), None]).output
    g.outputs = [g.add_node("add", [r, m], names=["out"]).output]
    return g


def attention_eager(g: Graph, x: torch.Tensor) -> torch.Tensor:
    w = g.weight_data
    h = F.layer_norm(x, [DIM], w["ln_w"], w["ln_b"])
    q, k, v = (F.linear(h, w[n]).reshape(1, -1, HEADS, HEAD).transpose(1, 2)
               for n in ("wq", "wk", "wv"))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    r = x + F.linear(a.transpose(1, 2).reshape(1, -1, DIM), w["wo"])
    return r + F.linear(F.gelu(F.linear(r, w["w1"], w["b1"]), approximate="tanh"), w["w2"])


def test_capabilities_cover_the_op_table():
    caps = backends.get("reference").capabilities()
    assert caps.ops == frozenset(OPS)
    assert caps.dtypes == frozenset(d.value for d in DType) and caps.symbolic_shapes


def test_lower_writes_no_payload():
    g = attention_block()
    assert ReferenceBackend().lower(g, {}, {}) == {}
    with pytest.raises(DayzeroError, match="takes no options"):
        ReferenceBackend().lower(g, {}, {"fast": True})


@pytest.mark.parametrize("seq", [2, 5, 32])
def test_attention_block_matches_eager(tmp_path, seq):
    g = attention_block()
    m = runtime.load(write_artifact(tmp_path / "m.dz", g, "reference"))
    assert m.output_specs[0].shape == (1, "s0", DIM)
    x = torch.randn(1, seq, DIM, generator=torch.Generator().manual_seed(seq))
    (out,) = m(x)
    np.testing.assert_allclose(out, attention_eager(g, x).numpy(), rtol=1e-5, atol=1e-5)


def test_embedding_with_integer_inputs(tmp_path):
    g = Graph()
    g.symbols["s0"] = (1, 10)
    ids = g.add_input("ids", TensorType(DType.i64, (1, S0)))
    table = weight(g, "table", 20, 4, seed=0)
    e = g.add_node("embedding", [table, ids]).output
    g.outputs = [g.add_node("softmax", [e], {"dim": -1}, names=["p"]).output]
    m = runtime.load(write_artifact(tmp_path / "m.dz", g, "reference"))
    x = torch.tensor([[3, 19, 0, 7]])
    expected = torch.softmax(F.embedding(x, g.weight_data["table"]), -1)
    np.testing.assert_allclose(m(x.numpy())[0], expected.numpy(), rtol=1e-5, atol=1e-6)


def test_stored_weights_must_match_declarations():
    g = attention_block()
    good = {name: torch.as_tensor(t) for name, t in g.weight_data.items()}
    check_weights(g, good, "here")
    with pytest.raises(ArtifactError, match="weight 'wq' is declared in graph.dzir but not stored"):
        check_weights(g, {k: v for k, v in good.items() if k != "wq"}, "here")
    with pytest.raises(ArtifactError, match=r"weight 'wq' is stored as f16\[8, 8\] but declared "
                                            r"f32\[8, 8\]"):
        check_weights(g, {**good, "wq": good["wq"].half()}, "here")
