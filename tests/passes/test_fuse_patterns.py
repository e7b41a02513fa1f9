"""Every fusion pattern: IR text in -> IR text out (tests/passes/fuse_cases/), the same values as
the unfused graph, and a second run that finds nothing left to do. Plus the cases each pattern
must refuse, with the reason `explain` gives."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest
import torch

from compiler.ir import parse_ir, print_ir
from passes import parse_pipeline
from passes.fusion.sets import RULE_SETS
from passes.rewrite import RuleSet, explain
from tests.passes.fusion_util import assert_same_values, fuse_text

CASES = Path(__file__).with_name("fuse_cases")
NAMES = sorted(p.name[:-len(".dzir")] for p in CASES.glob("*.dzir")
               if not p.name.endswith(".expected.dzir"))
ALL_RULES = sum(RULE_SETS.values(), RuleSet())


def _weights(text: str, seed: int = 3) -> dict[str, torch.Tensor]:
    graph = parse_ir(text)
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn([int(d) for d in v.shape], generator=gen).to(v.dtype.to_torch())
            for name, v in graph.weights.items()}


def test_every_pattern_set_has_cases():
    assert len(NAMES) >= 18
    fired = set()
    for name in NAMES:
        text = (CASES / f"{name}.dzir").read_text()
        _, manager = fuse_text(text, "fuse", _weights(text))
        fired |= {r.rule for r in manager.passes[0].records()}
    every_rule = set(ALL_RULES.names) | {"merge_linears"}
    # the constant causal mask has its own test below (it needs weight data)
    assert every_rule - fired == {"attention_causal_constant"}


@pytest.mark.parametrize("name", NAMES)
def test_pattern_text_in_text_out(name):
    text = (CASES / f"{name}.dzir").read_text()
    weights = _weights(text)
    graph, manager = fuse_text(text, "fuse", weights)
    assert print_ir(graph) == (CASES / f"{name}.expected.dzir").read_text()
    assert parse_ir(print_ir(graph)) is not None  # origin attributes parse back
    records = manager.passes[0].records()
    assert records and all(r.replaced for r in records)
    again = parse_pipeline("fuse")[0].run(graph)
    assert again.changed is False


@pytest.mark.parametrize("name", NAMES)
def test_pattern_keeps_values(name):
    text = (CASES / f"{name}.dzir").read_text()
    weights = _weights(text)
    graph, _ = fuse_text(text, "fuse", weights)
    atol = 2e-2 if "bf16" in text else 1e-5
    for seed in (0, 1):
        assert_same_values(text, graph, weights, atol=atol, seed=seed)


def test_fused_nodes_keep_anchor_loc_and_origin_round_trips():
    text = (CASES / "rotary.dzir").read_text()
    graph, _ = fuse_text(text)
    (node,) = [n for n in graph.nodes if n.op == "rotary_embedding"]
    assert node.loc == "llama.py:249"
    parsed = parse_ir(print_ir(graph))
    assert parsed.nodes[0].attrs["origin"] == node.attrs["origin"]
    assert node.attrs["origin"][-1] == "%out add"


def test_constant_causal_mask_becomes_is_causal():
    text = """
        graph main {
          input %q: f32[1, 2, 6, 8]
          input %k: f32[1, 2, 6, 8]
          input %v: f32[1, 2, 6, 8]
          weight @mask: f32[1, 1, 6, 6]
          weight @not_causal: f32[1, 1, 6, 6]
          %a: f32[1, 2, 6, 8] = scaled_dot_product_attention(%q, %k, %v, @mask) {scale=0.5}
          %b: f32[1, 2, 6, 8] = scaled_dot_product_attention(%q, %k, %v, @not_causal) {scale=0.5}
          return %a, %b
        }
    """
    causal = torch.full((6, 6), float("-inf")).triu(1).reshape(1, 1, 6, 6)
    other = causal.clone()
    other[0, 0, 0, 5] = 0.0
    weights = {"mask": causal, "not_causal": other}
    graph, manager = fuse_text(text, "fuse", weights)
    a, b = graph.nodes
    assert a.attrs["is_causal"] is True and a.inputs[3] is None
    assert b.attrs["is_causal"] is False and b.inputs[3].name == "not_causal"
    assert [r.rule for r in manager.passes[0].records()] == ["attention_causal_constant"]
    assert_same_values(text, graph, weights)


# -- refusals: what must not fuse, and the reason given ------------------------------------------
REFUSED = {
    "mean over the first dim is not a norm": ("""
        graph main {
          input %x: f32[4, 8]
          %sq: f32[4, 8] = mul(%x, %x)
          %var: f32[1, 8] = mean(%sq) {dims=[0], keepdim=true}
          %eps: f32[] = constant() {value=1e-06, dtype=f32}
          %var_eps: f32[1, 8] = add(%var, %eps)
          %r: f32[1, 8] = rsqrt(%var_eps)
          %n: f32[4, 8] = mul(%x, %r)
          return %n
        }""", "n", "the mean is over dims [0], not the last dims of %x"),
    "an intermediate read elsewhere": ("""
        graph main {
          input %x: f32[4, 8]
          %sq: f32[4, 8] = mul(%x, %x)
          %var: f32[4, 1] = mean(%sq) {dims=[-1], keepdim=true}
          %eps: f32[] = constant() {value=1e-06, dtype=f32}
          %var_eps: f32[4, 1] = add(%var, %eps)
          %r: f32[4, 1] = rsqrt(%var_eps)
          %n: f32[4, 8] = mul(%x, %r)
          return %n, %var
        }""", "n", "%var (mean) is a graph output and would be computed twice"),
    "partial rotary": ("""
        graph main {
          input %x: f32[1, 2, 3, 16]
          input %cos: f32[1, 1, 3, 16]
          input %sin: f32[1, 1, 3, 16]
          %xc: f32[1, 2, 3, 16] = mul(%x, %cos)
          %x1: f32[1, 2, 3, 4] = slice(%x) {dim=3, start=0, end=4, step=1}
          %x2: f32[1, 2, 3, 12] = slice(%x) {dim=3, start=4, end=16, step=1}
          %nx2: f32[1, 2, 3, 12] = neg(%x2)
          %rot: f32[1, 2, 3, 16] = concat(%nx2, %x1) {dim=-1}
          %rs: f32[1, 2, 3, 16] = mul(%rot, %sin)
          %out: f32[1, 2, 3, 16] = add(%xc, %rs)
          return %out
        }""", "out", "the halves [0:4] and [4:16] do not split 16 in two"),
    "softmax over the query axis": ("""
        graph main {
          input %q: f32[1, 2, 4, 8]
          input %k: f32[1, 2, 4, 8]
          input %v: f32[1, 2, 4, 8]
          %kt: f32[1, 2, 8, 4] = permute(%k) {dims=[0, 1, 3, 2]}
          %s: f32[1, 2, 4, 4] = matmul(%q, %kt)
          %p: f32[1, 2, 4, 4] = softmax(%s) {dim=2}
          %out: f32[1, 2, 4, 8] = matmul(%p, %v)
          return %out
        }""", "out", "softmax over dim 2, not the key axis"),
    "causal mask with a query offset": ("""
        graph main {
          input %q: f32[1, 2, 3, 8]
          input %k: f32[1, 2, 5, 8]
          input %v: f32[1, 2, 5, 8]
          %ones: bool[3, 5] = full() {shape=[3, 5], value=true, dtype=bool}
          %low: bool[3, 5] = tril(%ones) {diagonal=0}
          %out: f32[1, 2, 3, 8] = scaled_dot_product_attention(%q, %k, %v, %low)
          return %out
        }""", "out", "query and key lengths differ (a cache offset needs an explicit mask)"),
    "a constant tensor is no scalar (it would broadcast x)": ("""
        graph main {
          input %x: f32[8]
          %half: f32[3, 8] = full() {shape=[3, 8], value=0.5, dtype=f32}
          %root2: f32[] = constant() {value=1.4142135623730951, dtype=f32}
          %one: f32[] = constant() {value=1.0, dtype=f32}
          %s: f32[8] = div(%x, %root2)
          %e: f32[8] = erf(%s)
          %e1: f32[8] = add(%e, %one)
          %hx: f32[3, 8] = mul(%x, %half)
          %out: f32[3, 8] = mul(%hx, %e1)
          return %out
        }""", "out", "%half (full) is not a scalar constant"),
    "a mask that adds batch dims": ("""
        graph main {
          input %q: f32[1, 2, 4, 8]
          input %k: f32[1, 2, 4, 8]
          input %v: f32[1, 2, 4, 8]
          input %mask: f32[3, 1, 4, 4]
          %kt: f32[1, 2, 8, 4] = permute(%k) {dims=[0, 1, 3, 2]}
          %s: f32[1, 2, 4, 4] = matmul(%q, %kt)
          %m: f32[3, 2, 4, 4] = add(%s, %mask)
          %p: f32[3, 2, 4, 4] = softmax(%m) {dim=-1}
          %out: f32[3, 2, 4, 8] = matmul(%p, %v)
          return %out
        }""", "out", "the mask broadcasts the scores to more batch dims than q has"),
    "a KV cache output keeps the heads split": ("""
        graph main {
          input %q: f32[1, 3, 32]
          input %k: f32[1, 3, 32]
          input %v: f32[1, 3, 32]
          %qh: f32[1, 3, 4, 8] = reshape(%q) {shape=[1, 3, 4, 8]}
          %qt: f32[1, 4, 3, 8] = permute(%qh) {dims=[0, 2, 1, 3]}
          %kh: f32[1, 3, 4, 8] = reshape(%k) {shape=[1, 3, 4, 8]}
          %kt: f32[1, 4, 3, 8] = permute(%kh) {dims=[0, 2, 1, 3]}
          %vh: f32[1, 3, 4, 8] = reshape(%v) {shape=[1, 3, 4, 8]}
          %vt: f32[1, 4, 3, 8] = permute(%vh) {dims=[0, 2, 1, 3]}
          %o: f32[1, 4, 3, 8] = scaled_dot_product_attention(%qt, %kt, %vt, _) {is_causal=true}
          %ot: f32[1, 3, 4, 8] = permute(%o) {dims=[0, 2, 1, 3]}
          %out: f32[1, 3, 32] = reshape(%ot) {shape=[1, 3, 32]}
          return %out, %kt
        }""", "out", "%kt (permute) is a graph output and would be computed twice"),
    "heads merged in another order": ("""
        graph main {
          input %q: f32[1, 3, 32]
          input %k: f32[1, 3, 32]
          input %v: f32[1, 3, 32]
          %qh: f32[1, 3, 4, 8] = reshape(%q) {shape=[1, 3, 4, 8]}
          %qt: f32[1, 4, 3, 8] = permute(%qh) {dims=[0, 2, 1, 3]}
          %kh: f32[1, 3, 4, 8] = reshape(%k) {shape=[1, 3, 4, 8]}
          %kt: f32[1, 4, 3, 8] = permute(%kh) {dims=[0, 2, 1, 3]}
          %vh: f32[1, 3, 4, 8] = reshape(%v) {shape=[1, 3, 4, 8]}
          %vt: f32[1, 4, 3, 8] = permute(%vh) {dims=[0, 2, 1, 3]}
          %o: f32[1, 4, 3, 8] = scaled_dot_product_attention(%qt, %kt, %vt, _) {is_causal=true}
          %ot: f32[1, 3, 4, 8] = permute(%o) {dims=[0, 2, 1, 3]}
          %out: f32[1, 3, 8, 4] = reshape(%ot) {shape=[1, 3, 8, 4]}
          return %out
        }""", "out", "the heads are not merged back to [batch, seq, heads * head_size]"),
    "a softcap whose divisor and factor differ": ("""
        graph main {
          input %q: f32[1, 2, 4, 8]
          input %k: f32[1, 2, 4, 8]
          input %v: f32[1, 2, 4, 8]
          %kt: f32[1, 2, 8, 4] = permute(%k) {dims=[0, 1, 3, 2]}
          %s: f32[1, 2, 4, 4] = matmul(%q, %kt)
          %c50: f32[] = constant() {value=50.0, dtype=f32}
          %c30: f32[] = constant() {value=30.0, dtype=f32}
          %d: f32[1, 2, 4, 4] = div(%s, %c50)
          %t: f32[1, 2, 4, 4] = tanh(%d)
          %c: f32[1, 2, 4, 4] = mul(%t, %c30)
          %p: f32[1, 2, 4, 4] = softmax(%c) {dim=-1}
          %out: f32[1, 2, 4, 8] = matmul(%p, %v)
          return %out
        }""", "out", "the softcap's divisor and factor are not one positive constant"),
    "latent split with a gap between keys and values": ("""
        graph main {
          input %q: f32[1, 4, 3, 16]
          input %latent: f32[1, 1, 3, 16]
          input %k_rope: f32[1, 1, 3, 8]
          input %kv_b: f32[80, 16]
          %kv: f32[1, 1, 3, 80] = linear(%latent, %kv_b, _)
          %kvh: f32[1, 3, 4, 20] = reshape(%kv) {shape=[1, 3, 4, 20]}
          %kvt: f32[1, 4, 3, 20] = permute(%kvh) {dims=[0, 2, 1, 3]}
          %k_nope: f32[1, 4, 3, 8] = slice(%kvt) {dim=3, start=0, end=8, step=1}
          %v: f32[1, 4, 3, 11] = slice(%kvt) {dim=3, start=9, end=20, step=1}
          %k_shared: f32[1, 4, 3, 8] = expand(%k_rope) {shape=[1, 4, 3, 8]}
          %k: f32[1, 4, 3, 16] = concat(%k_nope, %k_shared) {dim=3}
          %o: f32[1, 4, 3, 11] = scaled_dot_product_attention(%q, %k, %v, _) {is_causal=true}
          %ot: f32[1, 3, 4, 11] = permute(%o) {dims=[0, 2, 1, 3]}
          %out: f32[1, 3, 44] = reshape(%ot) {shape=[1, 3, 44]}
          return %out
        }""", "out", "the expanded latent is not split into [dn | dv] per head"),
    "a bias add is not a residual add": ("""
        graph main {
          input %x: f32[2, 8]
          input %b: f32[8]
          %s: f32[2, 8] = add(%x, %b)
          %out: f32[2, 8] = layer_norm(%s, _, _) {normalized_shape=[8]}
          return %out
        }""", "out", "%s broadcasts its operands: a bias or mask add, not a residual add"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_patterns_say_why(case):
    text, node, reason = REFUSED[case]
    graph, manager = fuse_text(text)
    assert print_ir(graph) == print_ir(parse_ir(dedent(text)))
    assert manager.passes[0].records() == ()
    if node is not None:
        verdicts = dict(explain(graph, node, ALL_RULES))
        assert reason in verdicts.values(), verdicts


def test_horizontal_merge_needs_weight_data():
    text = (CASES / "horiz.dzir").read_text()
    graph, manager = fuse_text(text)  # a parsed graph: weights without data
    assert [n.op for n in graph.nodes] == ["linear"] * 4
    assert manager.passes[0].records() == ()


def test_pattern_sets_can_be_switched_off():
    text = (CASES / "mlp.dzir").read_text()
    graph, manager = fuse_text(text, "fuse{mlp=false,horizontal=false}")
    assert [n.op for n in graph.nodes] == ["fused_linear", "linear", "mul", "linear"]
    assert [r.rule for r in manager.passes[0].records()] == ["linear_activation"]
    assert manager.passes[0].spec() == "fuse{mlp=false,horizontal=false}"


def _moe_variant(old: str, new: str) -> str:
    text = (CASES / "moe.dzir").read_text()
    assert old in text
    return text.replace(old, new)


MOE_REFUSED = {
    "tanh scores are neither softmax nor sigmoid": (
        _moe_variant("= softmax(%logits) {dim=-1}", "= tanh(%logits)"),
        "the router's top-k scores are not a softmax or a sigmoid over the experts"),
    "weights divided by other than their sum": (
        _moe_variant("= sum(%top_w) {dims=[-1], keepdim=true}",
                     "= amax(%top_w) {dims=[-1], keepdim=true}"),
        "the routing weights are divided by something other than their sum"),
    "histc counting another range": (
        _moe_variant("{bins=4, min=0.0, max=3.0}", "{bins=4, min=0.0, max=4.0}"),
        "histc {'bins': 4, 'min': 0.0, 'max': 4.0} does not count 4 experts"),
    "gate and up swapped halves": (
        _moe_variant("%act: f32[2*s0, 6] = silu(%gate)", "%act: f32[2*s0, 6] = silu(%up)")
        .replace("= mul(%act, %up)", "= mul(%act, %gate)"),
        "gate and up are not the two halves [0:6] and [6:] of the projection"),
}


@pytest.mark.parametrize("case", sorted(MOE_REFUSED))
def test_moe_refusals_say_why(case):
    text, reason = MOE_REFUSED[case]
    graph, manager = fuse_text(text)
    assert "moe(" not in print_ir(graph)
    verdicts = dict(explain(graph, "out", ALL_RULES))
    assert verdicts.get("moe") == reason, verdicts


def _case_variant(name: str, old: str, new: str) -> str:
    text = (CASES / f"{name}.dzir").read_text()
    assert old in text
    return text.replace(old, new)


SHARED_REFUSED = {  # case -> (text, the rule rooted at %out, why it did not fire)
    "shared expert of another activation": (
        _case_variant("moe_deepseek_v3", "= silu(%s_g)", "= relu(%s_g)"), "moe_shared_view",
        "the shared expert's activation differs from the routed experts'"),
    "shared expert on other tokens": (
        _case_variant("moe_deepseek_v2", "linear(%x, @s_gate, _)", "linear(%routed, @s_gate, _)")
        .replace("linear(%x, @s_up, _)", "linear(%routed, @s_up, _)"), "moe_shared",
        "the shared expert does not run on the routed experts' tokens"),
}


@pytest.mark.parametrize("case", sorted(SHARED_REFUSED))
def test_shared_expert_refusals_say_why(case):
    """The routed experts still become `moe`; the shared expert stays beside it, and why."""
    text, rule_name, reason = SHARED_REFUSED[case]
    graph, _ = fuse_text(text)
    (node,) = [n for n in graph.nodes if n.op == "moe"]
    assert len(node.inputs) == 7
    verdicts = dict(explain(graph, "out", ALL_RULES))
    assert verdicts.get(rule_name) == reason, verdicts
