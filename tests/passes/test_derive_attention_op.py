"""derive_generation_step at the attention op: a bare `scaled_dot_product_attention` whose
query, key and value are computed token by token (a partial rotary with a concat, a QKV split)
is paged as they enter it, and anything that reads other tokens' rows is named with why
(passes/derive_generation_step/token_rows.py)."""

from __future__ import annotations

import pytest

from compiler.errors import DayzeroError
from compiler.ir import parse_ir, verify
from passes.derive_generation_step import DeriveGenerationStep

# GPT-NeoX's shape: one QKV projection split after the head split, a rotary (here a plain
# multiply by the position) on the first 4 of 8 dims of q and k, concatenated back
_ATTRS = "{is_causal=true, scale=0.25, enable_gqa=false, window=none, softcap=none}"
GRAPH = """graph main {
  symbol s0 in [2, 64]
  input %input_ids: i64[1, s0]
  weight @embed: f32[32, 16]
  weight @qkv: f32[48, 16]
  weight @lm_head: f32[32, 16]
  %h: f32[1, s0, 16] = embedding(@embed, %input_ids)
  %pos: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
  %posf: f32[s0] = cast(%pos) {dtype=f32}
  %angle: f32[s0, 1] = reshape(%posf) {shape=[s0, 1]}
  %x: f32[1, s0, 48] = linear(%h, @qkv, _)
  %x1: f32[1, s0, 2, 24] = reshape(%x) {shape=[1, s0, 2, 24]}
  %x2: f32[1, 2, s0, 24] = permute(%x1) {dims=[0, 2, 1, 3]}
  %q: f32[1, 2, s0, 8] = slice(%x2) {dim=3, start=0, end=8, step=1}
  %k: f32[1, 2, s0, 8] = slice(%x2) {dim=3, start=8, end=16, step=1}
  %v: f32[1, 2, s0, 8] = slice(%x2) {dim=3, start=16, end=24, step=1}
  %qr: f32[1, 2, s0, 4] = slice(%q) {dim=3, start=0, end=4, step=1}
  %qp: f32[1, 2, s0, 4] = slice(%q) {dim=3, start=4, end=8, step=1}
  %qrot: f32[1, 2, s0, 4] = mul(%qr, %angle)
  %q8: f32[1, 2, s0, 8] = concat(%qrot, %qp) {dim=3}
  %kr: f32[1, 2, s0, 4] = slice(%k) {dim=3, start=0, end=4, step=1}
  %kp: f32[1, 2, s0, 4] = slice(%k) {dim=3, start=4, end=8, step=1}
  %krot: f32[1, 2, s0, 4] = mul(%kr, %angle)
  %k8: f32[1, 2, s0, 8] = concat(%krot, %kp) {dim=3}
  %att: f32[1, 2, s0, 8] = scaled_dot_product_attention(%q8, %k8, %v, _) ATTRS
  %att1: f32[1, s0, 2, 8] = permute(%att) {dims=[0, 2, 1, 3]}
  %o: f32[1, s0, 16] = reshape(%att1) {shape=[1, s0, 16]}
  %logits: f32[1, s0, 32] = linear(%o, @lm_head, _)
  return %logits
}
""".replace("ATTRS", _ATTRS)


def _derive(text: str):
    graph = parse_ir(text)
    DeriveGenerationStep().run(graph)
    verify(graph)
    return graph


def test_the_attention_op_is_paged_with_the_rotated_keys_as_they_enter_it():
    graph = _derive(GRAPH)
    ops = [n.op for n in graph.nodes]
    assert "scaled_dot_product_attention" not in ops and ops.count("paged_attention") == 1
    (paged,) = [n for n in graph.nodes if n.op == "paged_attention"]
    assert paged.inputs[3] is None and paged.inputs[4] is None  # the rotary is in q and k
    # the cached key is the concat of the rotated and the pass-through halves, heads merged
    key = paged.inputs[1]
    assert key.producer.op == "reshape" and key.producer.inputs[0].producer.op == "permute"
    assert key.producer.inputs[0].producer.inputs[0].name == "k8"
    assert [v.name for v in graph.outputs] == ["logits_rows", "key_0", "value_0"]
    assert [tuple(map(str, v.shape)) for v in graph.outputs[1:]] == [("s0", "2", "8")] * 2
    assert "positions" in [v.name for v in graph.inputs]
    assert not any(n.op == "arange" for n in graph.nodes)


@pytest.mark.parametrize("old, new, words", [
    # a cumulative sum over the tokens: each row reads the rows before it
    ("%o: f32[1, s0, 16] = reshape(%att1) {shape=[1, s0, 16]}",
     "%o0: f32[1, s0, 16] = reshape(%att1) {shape=[1, s0, 16]}\n"
     "  %o: f32[1, s0, 16] = cumsum(%o0) {dim=1}",
     r"node %o \(cumsum\).*works along the token axis"),
    # a reshape that folds the tokens into the heads
    ("%x1: f32[1, s0, 2, 24] = reshape(%x) {shape=[1, s0, 2, 24]}",
     "%x0: f32[1, 2, s0, 24] = reshape(%x) {shape=[1, 2, s0, 24]}\n"
     "  %x1: f32[1, s0, 2, 24] = permute(%x0) {dims=[0, 2, 1, 3]}",
     r"node %x0 \(reshape\).*moves elements across the token axis"),
    # the sequence length read as a number
    ("%qrot: f32[1, 2, s0, 4] = mul(%qr, %angle)",
     "%len: f32[] = full() {shape=[], value=s0, dtype=f32}\n"
     "  %qrot: f32[1, 2, s0, 4] = mul(%qr, %len)",
     r"node %len \(full\).*reads the sequence length"),
], ids=["cumsum", "reshape", "length"])
def test_a_node_reading_other_tokens_is_named_with_why(old, new, words):
    assert old in GRAPH
    with pytest.raises(DayzeroError, match=words):
        _derive(GRAPH.replace(old, new))


def test_an_attention_op_that_is_not_causal_is_refused():
    text = GRAPH.replace("is_causal=true", "is_causal=false")
    with pytest.raises(DayzeroError, match=r"attention node %att \(scaled_dot_product_attention\)"
                                           ".*cannot read a KV cache: it is not causal"):
        _derive(text)


def test_an_attention_op_over_a_batch_is_refused():
    text = GRAPH.replace("%att: f32[1, 2, s0, 8] = scaled_dot_product_attention(%q8, %k8, %v, _)",
                         "%q9: f32[2, 1, s0, 8] = reshape(%q8) {shape=[2, 1, s0, 8]}\n"
                         "  %k9: f32[2, 1, s0, 8] = reshape(%k8) {shape=[2, 1, s0, 8]}\n"
                         "  %v9: f32[2, 1, s0, 8] = reshape(%v) {shape=[2, 1, s0, 8]}\n"
                         "  %att9: f32[2, 1, s0, 8] = scaled_dot_product_attention(%q9, %k9, "
                         "%v9, _)")
    text = text.replace(f"{_ATTRS}\n  %att1", f"{_ATTRS}\n  %att: f32[1, 2, s0, 8] = "
                        "reshape(%att9) {shape=[1, 2, s0, 8]}\n  %att1")
    with pytest.raises(DayzeroError, match=r"%att9 .*are not \[1, heads, tokens, head_size\]"):
        _derive(text)


def test_an_attention_written_out_in_ops_is_named_where_it_mixes_tokens():
    text = GRAPH.replace(f"%att: f32[1, 2, s0, 8] = scaled_dot_product_attention(%q8, %k8, %v, "
                         f"_) {_ATTRS}",
                         "%kt: f32[1, 2, 8, s0] = permute(%k8) {dims=[0, 1, 3, 2]}\n"
                         "  %scores: f32[1, 2, s0, s0] = matmul(%q8, %kt)\n"
                         "  %att: f32[1, 2, s0, 8] = matmul(%scores, %v)")
    assert "scaled_dot_product_attention" not in text
    with pytest.raises(DayzeroError, match=r"node %scores \(matmul\).*depends on the whole "
                                           "sequence.*a matrix over the tokens"):
        _derive(text)
