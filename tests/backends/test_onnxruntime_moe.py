"""The fused `moe` op on onnxruntime computes only each token's chosen experts.

Benchmark-free evidence: an expert whose weights are NaN poisons exactly the tokens routed to it,
as in eager (which never runs an expert for a token that did not choose it). A kernel that ran
every expert on every token and weighted the unchosen ones by zero would return NaN everywhere
(0 * NaN is NaN). Checked for com.microsoft.MoE and for the standard-op lowering of the op's
decomposition, against a per-token loop in torch.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from compiler.ir import DType, Graph, TensorType, symbol, verify
from tests.backends.onnxruntime_util import compile_graph, load
from tests.numerics import assert_fp32_close

S = symbol("s0")
EXPERTS, HIDDEN, INTER, TOP_K = 4, 8, 6, 2


def moe_graph(w_gate_up: np.ndarray, w_down: np.ndarray) -> Graph:
    g = Graph()
    g.symbols["s0"] = (1, 64)
    x = g.add_input("x", TensorType(DType.f32, (S, HIDDEN)))
    logits = g.add_input("logits", TensorType(DType.f32, (S, EXPERTS)))
    w1 = g.add_weight("w_gate_up", TensorType(DType.f32, w_gate_up.shape), w_gate_up)
    w2 = g.add_weight("w_down", TensorType(DType.f32, w_down.shape), w_down)
    node = g.add_node("moe", [x, logits, w1, w2, None, None, None],
                      {"top_k": TOP_K, "normalize": True})
    g.outputs = [node.output]
    verify(g)
    return g


def eager_routed(x, logits, w_gate_up, w_down) -> torch.Tensor:
    """Mixtral's routing and experts, one token and one chosen expert at a time."""
    weights, chosen = torch.softmax(logits, -1).topk(TOP_K)
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(TOP_K):
            e = int(chosen[t, j])
            h = x[t] @ w_gate_up[e]
            out[t] += weights[t, j] * ((torch.nn.functional.silu(h[:INTER]) * h[INTER:])
                                       @ w_down[e])
    return out


@pytest.mark.parametrize("exclude", [False, True], ids=["MoE kernel", "standard ops"])
def test_an_expert_runs_only_for_the_tokens_routed_to_it(tmp_path, exclude):
    gen = np.random.default_rng(0)
    w_gate_up = gen.standard_normal((EXPERTS, HIDDEN, 2 * INTER)).astype(np.float32)
    w_down = gen.standard_normal((EXPERTS, INTER, HIDDEN)).astype(np.float32)
    w_gate_up[3] = np.nan  # expert 3 is poisoned
    options = {"exclude_kernels": ["com.microsoft.MoE"]} if exclude else {}
    artifact = compile_graph(moe_graph(w_gate_up, w_down), tmp_path / "moe.dz", options)
    ops = [(n.domain, n.op_type) for n in onnx.load(
        str(artifact / "backend" / "model.onnx"), load_external_data=False).graph.node]
    assert (("com.microsoft", "MoE") in ops) is not exclude
    model = load(artifact)
    x = gen.standard_normal((9, HIDDEN)).astype(np.float32)
    logits = gen.standard_normal((9, EXPERTS)).astype(np.float32)
    logits[:, 3] = -30.0  # nobody picks expert 3 ...
    logits[[0, 5], 3] = 30.0  # ... but tokens 0 and 5
    got = model([x, logits])[0]
    want = eager_routed(*(torch.from_numpy(a) for a in (x, logits, w_gate_up, w_down)))
    assert np.isnan(got[[0, 5]]).all() and np.isnan(want[[0, 5]].numpy()).all()
    rest = [1, 2, 3, 4, 6, 7, 8]
    assert np.isfinite(got[rest]).all()
    assert_fp32_close(got[rest], want[rest])


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("case", ["moe", "moe_topk_softmax", "moe_deepseek_v3", "moe_deepseek_v2",
                                  "moe_shared_gated"])
def test_a_nonfinite_input_propagates_as_in_eager(case, value, tmp_path):
    """A NaN or Inf in one router logit or one hidden value, on com.microsoft.MoE with the
    routing computed beside it: NaN exactly where the op's decomposition (eager's computation)
    has it. com.microsoft.MoE's own routing would drop a NaN logit (its top-k skips it), so the
    lowering never relies on it; an infinite logit is a certain choice under a sigmoid, a NaN
    under a softmax."""
    from backends.reference.interpreter import run_graph
    from tests.backends.onnxruntime_cases import CASES
    from tests.backends.test_onnxruntime_ops import build, inputs_for
    from tests.test_nonfinite import assert_like_eager

    g = build(CASES[case])
    artifact = compile_graph(g, tmp_path / "m.dz")
    ops = [(n.domain, n.op_type) for n in onnx.load(
        str(artifact / "backend" / "model.onnx"), load_external_data=False).graph.node]
    assert ("com.microsoft", "MoE") in ops
    run = load(artifact)
    base = inputs_for(g, CASES[case], 9, 0)
    for i, at in ((1, 13), (0, 30)):  # logits[3, 1], x[3, 6]
        x = [a.copy() for a in base]
        x[i].reshape(-1)[at] = value
        want = [w.numpy() for w in run_graph(g, g.weight_data, [torch.from_numpy(a) for a in x])]
        assert_like_eager(run(x), want)
