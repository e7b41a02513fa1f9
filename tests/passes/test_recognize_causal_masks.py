"""recognize_causal_masks: IR text in -> IR text out, and the proof checked against the numbers.

The negative cases matter as much as the positive ones: a mask that is causal only at some sizes
(a sliding window shorter than the longest sequence, a cut-off at row 100) must stay a mask.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compiler
import runtime
from backends.reference.interpreter import run_graph
from compiler.ir import parse_ir, print_ir, symbolic
from compiler.ir.symbolic import symbol
from passes import index_expressions as ix
from passes.index_expressions import INDEX, Indexed
from passes.recognize_causal_masks import MaskProver

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PASS = "recognize_causal_masks"
SDPA_IN = ("  %o: f32[1, 2, s0, 8] = scaled_dot_product_attention(%q, %k, %v, %mask) "
           "{is_causal=false, scale=0.35, enable_gqa=false, window=none, softcap=none}")
SDPA_OUT = ("  %o: f32[1, 2, s0, 8] = scaled_dot_product_attention(%q, %k, %v, _) "
            "{is_causal=true, scale=0.35, enable_gqa=false, window=none, softcap=none}")


def attention(body: str, symbols: str = "symbol s0 in [2, 64]", extra: str = "") -> str:
    """A graph attending q, k, v of length s0 through `%mask`, computed by `body`."""
    lines = ["graph main {", f"  {symbols}", "  input %q: f32[1, 2, s0, 8]",
             "  input %k: f32[1, 2, s0, 8]", "  input %v: f32[1, 2, s0, 8]"]
    lines += [f"  {line.strip()}" for line in (extra + "\n" + body).splitlines() if line.strip()]
    return "\n".join(lines + [SDPA_IN, "  return %o", "}", ""])


ARANGE = """
    %r: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
    %row: i64[s0, 1] = reshape(%r) {shape=[s0, 1]}
    %col: i64[1, s0] = reshape(%r) {shape=[1, s0]}
"""


def test_arange_le_mask_becomes_is_causal(run_pass):
    text = attention(ARANGE + "%mask: bool[s0, s0] = le(%col, %row)")
    result = run_pass(text, PASS)
    assert result.changed is True
    assert print_ir(result.graph) == text.replace(SDPA_IN, SDPA_OUT)


# The mask transformers' sdpa path builds (as exported for Llama, GPT-2 and LLaVA, after
# fold_constants): causal AND "same packed sequence", the latter always true for arange positions.
PACKED = """
    %arange: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
    %zero: i64[] = constant() {value=0, dtype=i64}
    %add_5: i64[s0] = add(%arange, %zero)
    %unsqueeze: i64[1, s0] = reshape(%add_5) {shape=[1, s0]}
    %slice_1: i64[1, 1] = slice(%unsqueeze) {dim=1, start=0, end=1, step=1}
    %one: i64[] = constant() {value=1, dtype=i64}
    %sub_4: i64[1, 1] = sub(%slice_1, %one)
    %cat: i64[1, s0 + 1] = concat(%sub_4, %unsqueeze) {dim=1}
    %slice_2: i64[1, s0] = slice(%cat) {dim=1, start=0, end=s0, step=1}
    %slice_3: i64[1, s0] = slice(%cat) {dim=1, start=1, end=s0 + 1, step=1}
    %sub_11: i64[1, s0] = sub(%slice_3, %slice_2)
    %ne: bool[1, s0] = ne(%sub_11, %one)
    %cumsum_cast: i64[1, s0] = cast(%ne) {dtype=i64}
    %cumsum: i64[1, s0] = cumsum(%cumsum_cast) {dim=-1}
    %unsqueeze_9: i64[1, 1, s0, 1] = reshape(%add_5) {shape=[1, 1, s0, 1]}
    %unsqueeze_12: i64[1, 1, 1, s0] = reshape(%add_5) {shape=[1, 1, 1, s0]}
    %new_ones: bool[] = full() {shape=[], value=true, dtype=bool}
    %index: i64[1, 1, s0, 1] = index(%unsqueeze, @batch, %unsqueeze_9)
    %index_1: i64[1, 1, 1, s0] = index(%unsqueeze, @batch, %unsqueeze_12)
    %le_5: bool[1, 1, s0, s0] = le(%index_1, %index)
    %bitwise_and: bool[1, 1, s0, s0] = bitwise_and(%new_ones, %le_5)
    %index_2: i64[1, 1, s0, 1] = index(%cumsum, @batch, %unsqueeze_9)
    %index_3: i64[1, 1, 1, s0] = index(%cumsum, @batch, %unsqueeze_12)
    %eq_29: bool[1, 1, s0, s0] = eq(%index_2, %index_3)
    %mask: bool[1, 1, s0, s0] = bitwise_and(%bitwise_and, %eq_29)
"""
BATCH = "weight @batch: i64[1, 1, 1, 1]"


def test_packed_sequence_mask_like_llama_becomes_is_causal_and_dies(run_pass):
    text = attention(PACKED, extra=BATCH)
    weights = {"batch": torch.zeros(1, 1, 1, 1, dtype=torch.int64)}
    result = run_pass(text, PASS, weights)
    assert result.changed is True
    assert print_ir(result.graph) == text.replace(SDPA_IN, SDPA_OUT)
    dead = run_pass(print_ir(result.graph), "eliminate_dead_code")
    assert print_ir(dead.graph) == attention("").replace(SDPA_IN, SDPA_OUT)


def test_packed_sequence_mask_with_other_batch_index_is_kept(run_pass):
    """@batch = 1 indexes past the size-1 batch dim: no proof (torch would raise)."""
    weights = {"batch": torch.ones(1, 1, 1, 1, dtype=torch.int64)}
    result = run_pass(attention(PACKED, extra=BATCH), PASS, weights)
    assert result.changed is False


def test_packed_sequence_mask_without_weight_data_is_kept(run_pass):
    result = run_pass(attention(PACKED, extra=BATCH), PASS)
    assert result.changed is False


def test_padding_mask_from_graph_input_is_kept(run_pass):
    """Llama with an attention_mask input: causal AND the padding mask, which reads %am."""
    text = attention("""
        %am_bool: bool[1, s0] = cast(%am) {dtype=bool}
        %rows: i64[1, 1, s0, 1] = reshape(%r) {shape=[1, 1, s0, 1]}
        %cols: i64[1, 1, 1, s0] = reshape(%r) {shape=[1, 1, 1, s0]}
        %causal: bool[1, 1, s0, s0] = le(%cols, %rows)
        %pad: bool[1, 1, 1, s0] = index(%am_bool, @batch, %cols)
        %mask: bool[1, 1, s0, s0] = bitwise_and(%causal, %pad)
    """, extra="input %am: i64[1, s0]\n" + BATCH
        + "\n%r: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}")
    weights = {"batch": torch.zeros(1, 1, 1, 1, dtype=torch.int64)}
    result = run_pass(text, PASS, weights)
    assert result.changed is False
    assert print_ir(result.graph) == text


NOT_CAUSAL = {
    "offset_by_one": "%c1: i64[1, s0] = add(%col, %k1)\n%mask: bool[s0, s0] = le(%c1, %row)",
    "strict": "%mask: bool[s0, s0] = lt(%col, %row)",
    "upper_triangle": "%mask: bool[s0, s0] = ge(%col, %row)",
    "strict_sliding_window_4": """
        %gap: i64[s0, s0] = sub(%row, %col)
        %near: bool[s0, s0] = lt(%gap, %k4)
        %causal: bool[s0, s0] = lt(%col, %row)
        %mask: bool[s0, s0] = logical_and(%causal, %near)
    """,
    "window_without_causal": """
        %gap: i64[s0, s0] = sub(%row, %col)
        %mask: bool[s0, s0] = lt(%gap, %k4)
    """,
    "window_growing_with_row": """
        %gap: i64[s0, s0] = sub(%row, %col)
        %near: bool[s0, s0] = lt(%gap, %row)
        %causal: bool[s0, s0] = le(%col, %row)
        %mask: bool[s0, s0] = logical_and(%causal, %near)
    """,
    "cut_at_row_100": """
        %early: bool[s0, 1] = lt(%row, %k100)
        %causal: bool[s0, s0] = le(%col, %row)
        %mask: bool[s0, s0] = logical_and(%causal, %early)
    """,
    "diagonal_only": "%mask: bool[s0, s0] = eq(%col, %row)",
    "all_true": "%mask: bool[s0, s0] = full() {shape=[s0, s0], value=true, dtype=bool}",
}
CONSTANTS = """
    %k1: i64[] = constant() {value=1, dtype=i64}
    %k4: i64[] = constant() {value=4, dtype=i64}
    %k100: i64[] = constant() {value=100, dtype=i64}
"""


@pytest.mark.parametrize("name", sorted(NOT_CAUSAL))
def test_masks_that_are_not_causal_for_every_size_are_kept(run_pass, name):
    text = attention(ARANGE + CONSTANTS + NOT_CAUSAL[name], symbols="symbol s0 in [2, 512]")
    result = run_pass(text, PASS)
    assert result.changed is False
    assert print_ir(result.graph) == text


SLIDING_OUT = SDPA_OUT.replace("window=none", "window=4")
SLIDING = """
    %gap: i64[s0, s0] = sub(%row, %col)
    %near: bool[s0, s0] = lt(%gap, %k4)
    %causal: bool[s0, s0] = le(%col, %row)
    %mask: bool[s0, s0] = logical_and(%causal, %near)
"""


def test_sliding_window_mask_becomes_is_causal_with_window(run_pass):
    """key <= query and query - key < 4: causal within a window of 4 keys (the query's own)."""
    text = attention(ARANGE + CONSTANTS + SLIDING, symbols="symbol s0 in [2, 512]")
    result = run_pass(text, PASS)
    assert result.changed is True
    assert print_ir(result.graph) == text.replace(SDPA_IN, SLIDING_OUT)


def test_window_no_shorter_than_every_sequence_is_plain_causal(run_pass):
    """With s0 <= 4 the window never cuts: no window attribute (the proof drops the atom)."""
    text = attention(ARANGE + CONSTANTS + SLIDING, symbols="symbol s0 in [2, 4]")
    assert print_ir(run_pass(text, PASS).graph) == text.replace(SDPA_IN, SDPA_OUT)
    text = attention(ARANGE + CONSTANTS + SLIDING, symbols="symbol s0 in [2, 5]")
    assert print_ir(run_pass(text, PASS).graph) == text.replace(SDPA_IN, SLIDING_OUT)


# transformers' sdpa mask for Mistral (sliding_window=4), as exported and after fold_constants:
# kv_idx > q_idx - 4, kv_idx <= q_idx, and the packed-sequence term.
MISTRAL = PACKED.replace("""    %le_5: bool[1, 1, s0, s0] = le(%index_1, %index)
    %bitwise_and: bool[1, 1, s0, s0] = bitwise_and(%new_ones, %le_5)
""", """    %four: i64[] = constant() {value=4, dtype=i64}
    %back: i64[1, 1, s0, 1] = sub(%index, %four)
    %gt: bool[1, 1, s0, s0] = gt(%index_1, %back)
    %and_1: bool[1, 1, s0, s0] = bitwise_and(%new_ones, %gt)
    %le_5: bool[1, 1, s0, s0] = le(%index_1, %index)
    %and_2: bool[1, 1, s0, s0] = bitwise_and(%and_1, %le_5)
    %bitwise_and: bool[1, 1, s0, s0] = bitwise_and(%new_ones, %and_2)
""")


def test_mistral_sliding_window_mask_becomes_window_4_and_dies(run_pass):
    assert MISTRAL != PACKED
    text = attention(MISTRAL, extra=BATCH)
    weights = {"batch": torch.zeros(1, 1, 1, 1, dtype=torch.int64)}
    result = run_pass(text, PASS, weights)
    assert print_ir(result.graph) == text.replace(SDPA_IN, SLIDING_OUT)
    dead = run_pass(print_ir(result.graph), "eliminate_dead_code")
    assert print_ir(dead.graph) == attention("").replace(SDPA_IN, SLIDING_OUT)


def test_additive_sliding_window_mask_on_multi_head_attention(run_pass):
    """Gemma 2's eager mask (0 / f32's minimum) on the fused op, read at its own operand slots."""
    text = f"""graph main {{
  symbol s0 in [2, 64]
  input %q: f32[1, s0, 32]
  input %k: f32[1, s0, 16]
  input %v: f32[1, s0, 16]
  {ARANGE.strip()}
  %k4: i64[] = constant() {{value=4, dtype=i64}}
  %back: i64[s0, 1] = sub(%row, %k4)
  %near: bool[s0, s0] = gt(%col, %back)
  %causal: bool[s0, s0] = le(%col, %row)
  %keep: bool[s0, s0] = logical_and(%near, %causal)
  %zero: f32[] = constant() {{value=0.0, dtype=f32}}
  %low: f32[] = constant() {{value=-3.4028234663852886e+38, dtype=f32}}
  %bias: f32[s0, s0] = where(%keep, %zero, %low)
  %mask: f32[1, 1, s0, s0] = reshape(%bias) {{shape=[1, 1, s0, s0]}}
  %o: f32[1, s0, 32] = multi_head_attention(%q, %k, %v, _, _, %mask) {{num_heads=4, kv_num_heads=2, scale=0.25, is_causal=false, window=none, softcap=50.0}}
  return %o
}}
"""  # noqa: E501
    text = "\n".join(line.strip() if not line.startswith("  ") else "  " + line.strip()
                     for line in text.splitlines()) + "\n"
    result = run_pass(text, PASS)
    assert result.changed is True
    want = text.replace("%v, _, _, %mask) {num_heads=4, kv_num_heads=2, scale=0.25, "
                        "is_causal=false, window=none",
                        "%v, _, _, _) {num_heads=4, kv_num_heads=2, scale=0.25, "
                        "is_causal=true, window=4")
    assert print_ir(result.graph) == want


def test_transposed_upper_triangle_is_causal(run_pass):
    """permute of (col >= row) is (row >= col) read the other way round: causal."""
    body = "%upper: bool[s0, s0] = ge(%col, %row)\n%mask: bool[s0, s0] = permute(%upper) " \
           "{dims=[1, 0]}"
    assert run_pass(attention(ARANGE + body), PASS).changed is True


@pytest.mark.parametrize("bias, causal", [(1, True), (-1, False), (2, False)])
def test_scaled_comparison(run_pass, bias, causal):
    """2*key <= 2*query + 1 is key <= query over the integers; + 2 or - 1 is not."""
    body = ARANGE + f"""
        %two: i64[] = constant() {{value=2, dtype=i64}}
        %bias: i64[] = constant() {{value={bias}, dtype=i64}}
        %col2: i64[1, s0] = mul(%col, %two)
        %row2: i64[s0, 1] = mul(%row, %two)
        %row2b: i64[s0, 1] = add(%row2, %bias)
        %mask: bool[s0, s0] = le(%col2, %row2b)
    """
    assert run_pass(attention(body), PASS).changed is causal


@pytest.mark.parametrize("bound, causal", [("[2, 100]", True), ("[2, 101]", False)])
def test_proof_holds_for_the_whole_symbol_range(run_pass, bound, causal):
    """row < 100 cuts nothing while s0 <= 100; one size past that and the mask is not causal."""
    text = attention(ARANGE + CONSTANTS + NOT_CAUSAL["cut_at_row_100"],
                     symbols=f"symbol s0 in {bound}")
    assert run_pass(text, PASS).changed is causal


def test_different_query_and_key_lengths_are_kept(run_pass):
    text = """
        graph main {
          symbol s0 in [2, 64]
          symbol s1 in [2, 64]
          input %q: f32[1, 2, s0, 8]
          input %k: f32[1, 2, s1, 8]
          input %v: f32[1, 2, s1, 8]
          %r: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
          %c: i64[s1] = arange() {start=0, end=s1, step=1, dtype=i64}
          %row: i64[s0, 1] = reshape(%r) {shape=[s0, 1]}
          %mask: bool[s0, s1] = le(%c, %row)
          %o: f32[1, 2, s0, 8] = scaled_dot_product_attention(%q, %k, %v, %mask) {is_causal=false, scale=0.35, enable_gqa=false, window=none, softcap=none}
          return %o
        }
    """  # noqa: E501
    assert run_pass(text, PASS).changed is False


ADDITIVE = """
    %causal: bool[s0, s0] = le(%col, %row)
    %zero: f32[] = constant() {value=0.0, dtype=f32}
    %blocked: f32[] = constant() {value=%s, dtype=f32}
    %mask: f32[s0, s0] = where(%causal, %zero, %blocked)
"""


@pytest.mark.parametrize("blocked, causal", [("-inf", True), ("-3.4028234663852886e+38", True),
                                             ("-10000.0", False)])
def test_additive_float_mask(run_pass, blocked, causal):
    """0 where key <= query and -inf (or f32's minimum) elsewhere is causal; -1e4 is not."""
    text = attention(ARANGE + ADDITIVE.replace("%s", blocked))
    assert run_pass(text, PASS).changed is causal


def test_triu_of_dtype_minimum_is_causal(run_pass):
    """The older transformers recipe: full(min) kept strictly above the diagonal."""
    body = """
        %fill: f32[s0, s0] = full() {shape=[s0, s0], value=-3.4028234663852886e+38, dtype=f32}
        %mask: f32[s0, s0] = triu(%fill) {diagonal=1}
    """
    assert run_pass(attention(body), PASS).changed is True


# -- the verdict against the numbers -----------------------------------------------------------
SIZES = range(2, 10)
COMPARE = ("le", "lt", "ge", "gt")


def _variant(op: str, swap: bool, shift: int, window: int | None) -> str:
    lhs, rhs = ("%row", "%cs") if swap else ("%cs", "%row")
    body = ARANGE + f"""
        %shift: i64[] = constant() {{value={shift}, dtype=i64}}
        %cs: i64[1, s0] = add(%col, %shift)
        %rel: bool[s0, s0] = {op}({lhs}, {rhs})
    """
    if window is None:
        return body + "%mask: bool[s0, s0] = logical_and(%rel, %rel)"
    return body + f"""
        %w: i64[] = constant() {{value={window}, dtype=i64}}
        %gap: i64[s0, s0] = sub(%row, %col)
        %near: bool[s0, s0] = lt(%gap, %w)
        %mask: bool[s0, s0] = logical_and(%rel, %near)
    """


def _numerically_causal(graph, window: int | None) -> bool:
    """Whether the mask equals tril (cut to `window` keys) at every size of s0's (small) range."""
    graph.outputs = [graph.nodes[-2].outputs[0]]
    for n in SIZES:
        x = torch.zeros(1, 2, n, 8)
        (mask,) = run_graph(graph, {}, [x, x, x])
        want = torch.ones(n, n, dtype=torch.bool).tril()
        if not torch.equal(mask, want if window is None else want.triu(1 - window)):
            return False
    return True


VARIANTS = list(itertools.product(COMPARE, (False, True), (-1, 0, 1), (None, 3, 9)))


@pytest.mark.parametrize("op, swap, shift, window", VARIANTS)
def test_verdict_matches_every_size_in_range(op, swap, shift, window):
    """Exhaustive over s0 in [2, 9]: rewritten exactly when the mask is tril at every size, cut
    to the window the proof reports (window 9 never cuts there, window 3 does)."""
    text = attention(_variant(op, swap, shift, window), symbols="symbol s0 in [2, 9]")
    graph = parse_ir(text)
    verdict = MaskProver(graph).verdict(graph.nodes[-1])
    assert verdict.window in (None, 3)
    assert (verdict.why is None) == _numerically_causal(graph, verdict.window)
    if verdict.why is not None and window == 3:  # not rewritten: nor causal with that window
        assert not _numerically_causal(graph, 3)


# -- every expression against the reference interpreter -------------------------------------------
PROGRAMS = {
    "packed": PACKED,
    "views": """
        %r: i64[s0] = arange() {start=2, end=s0 + 2, step=1, dtype=i64}
        %a: i64[1, s0] = reshape(%r) {shape=[1, s0]}
        %b: i64[3, s0] = expand(%a) {shape=[3, s0]}
        %k3: i64[3] = arange() {start=0, end=3, step=1, dtype=i64}
        %k3c: i64[3, 1] = reshape(%k3) {shape=[3, 1]}
        %c: i64[3, s0] = add(%b, %k3c)
        %seven: i64[] = constant() {value=-7, dtype=i64}
        %c7: i64[3, s0] = mul(%c, %seven)
        %d: i64[s0, 3] = permute(%c7) {dims=[1, 0]}
        %e: i64[s0, 2] = slice(%d) {dim=1, start=1, end=3, step=1}
        %f: i64[s0] = select(%e) {dim=1, index=-1}
        %g: i64[s0 + 3] = concat(%f, %k3) {dim=0}
        %h: i64[2] = slice(%k3) {dim=0, start=0, end=3, step=2}
        %n: i64[s0 + 5] = concat(%h, %k3, %f) {dim=0}
        %ng: i64[s0] = neg(%f)
        %p: i64[s0 - 1] = slice(%n) {dim=0, start=6, end=s0 + 5, step=1}
        %five: i64[1] = full() {shape=[1], value=5, dtype=i64}
        %cat5: i64[s0 + 1] = concat(%five, %r) {dim=0}
    """,
    "indexing": """
        %r: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
        %ten: i64[] = constant() {value=10, dtype=i64}
        %hundred: i64[] = constant() {value=100, dtype=i64}
        %r10: i64[s0] = mul(%r, %ten)
        %rows: i64[s0, 1] = reshape(%r10) {shape=[s0, 1]}
        %c4: i64[4] = arange() {start=0, end=4, step=1, dtype=i64}
        %base: i64[s0, 4] = add(%rows, %c4)
        %a2: i64[2] = arange() {start=0, end=2, step=1, dtype=i64}
        %a200: i64[2] = mul(%a2, %hundred)
        %planes: i64[2, 1, 1] = reshape(%a200) {shape=[2, 1, 1]}
        %base3: i64[2, s0, 4] = add(%planes, %base)
        %last: i64[] = full() {shape=[], value=s0 - 1, dtype=i64}
        %rev: i64[s0] = sub(%last, %r)
        %ia: i64[2, 1] = reshape(%a2) {shape=[2, 1]}
        %ib: i64[1, 4] = reshape(%c4) {shape=[1, 4]}
        %apart: i64[2, 4, s0] = index(%base3, %ia, _, %ib)
        %together: i64[2, s0, 4] = index(%base3, _, %rev)
        %wide: i64[2, 2, 1, 4] = index(%base3, _, %ia)
        %chosen: i64[s0, 4] = index_select(%base, %rev) {dim=0}
        %twice: i64[2, 4] = index(%base, %ia, %ib)
        %ranked: i64[2, 4] = index(%base, %ia, %c4)
        %second_row: i64[4] = select(%base) {dim=0, index=1}
        %rot: i64[s0, 4, 2] = permute(%base3) {dims=[1, 2, 0]}
    """,
    "logic": """
        %r: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
        %row: i64[s0, 1] = reshape(%r) {shape=[s0, 1]}
        %col: i64[1, s0] = reshape(%r) {shape=[1, s0]}
        %t: bool[s0, s0] = lt(%col, %row)
        %u: bool[s0, s0] = logical_not(%t)
        %w: i64[s0, s0] = where(%t, %row, %col)
        %c: f32[s0, s0] = cast(%t) {dtype=f32}
        %tr: f32[s0, s0] = triu(%c) {diagonal=-1}
        %tl: bool[s0, s0] = tril(%u) {diagonal=1}
        %ninf: f32[] = constant() {value=-inf, dtype=f32}
        %z: f32[] = constant() {value=0.0, dtype=f32}
        %additive: f32[s0, s0] = where(%tl, %z, %ninf)
        %x: bool[s0, s0] = logical_xor(%t, %tl)
        %e: bool[s0, s0] = eq(%t, %tl)
        %n: bool[s0, s0] = ne(%w, %row)
        %ones: bool[s0, s0] = full() {shape=[s0, s0], value=true, dtype=bool}
        %onesi: i64[s0, s0] = cast(%ones) {dtype=i64}
        %down: i64[s0, s0] = cumsum(%onesi) {dim=0}
        %ti: i64[s0, s0] = cast(%t) {dtype=i64}
        %unread: i64[s0, s0] = cumsum(%ti) {dim=1}
        %half: f16[s0] = cast(%r) {dtype=f16}
        %back: bool[s0] = cast(%half) {dtype=bool}
        %ge: bool[s0, s0] = ge(%down, %w)
    """,
}
UNREADABLE = {"unread"}  # cumsum of a summand that depends on the scanned index


def _elements(x, bindings) -> np.ndarray:
    """An Indexed evaluated at concrete sizes; asserts exactly one case holds at each element."""
    sizes = {symbol(name): value for name, value in bindings.items()}
    shape = [int(symbolic.evaluate(d, bindings)) for d in x.shape]
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        env = {**sizes, **{INDEX[d]: k for d, k in enumerate(idx)}}
        hits = [v for c, v in x.cases if bool(c.xreplace(env))]
        assert len(hits) == 1, f"{len(hits)} cases hold at {idx}"
        out[idx] = hits[0].xreplace(env)
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_expression_matches_the_reference_interpreter(name):
    """Each transfer rule is checked on its own: every value the prover reads, at every element
    and at several sizes, equals what the reference backend computes."""
    body = PROGRAMS[name]
    if "%mask:" not in body:
        body += "%mask: bool[s0, s0] = full() {shape=[s0, s0], value=true, dtype=bool}"
    graph = parse_ir(attention(body, symbols="symbol s0 in [2, 6]", extra=BATCH))
    weights = {"batch": torch.zeros(1, 1, 1, 1, dtype=torch.int64)}
    graph.weight_data.update(weights)
    prover = MaskProver(graph)
    values = [n.outputs[0] for n in graph.nodes[:-1]]
    read = {v.name: prover.expression(v) for v in values}
    assert {k for k, x in read.items() if x is None} == (UNREADABLE if name == "logic" else set())
    graph.outputs = values
    for n in (2, 3, 6):
        x = torch.zeros(1, 2, n, 8)
        tensors = run_graph(graph, weights, [x, x, x])
        for value, tensor in zip(values, tensors):
            if read[value.name] is None:
                continue
            got = _elements(read[value.name], {"s0": n})
            want = tensor.numpy()
            assert got.shape == want.shape, value.name
            got = got.astype(bool if want.dtype == bool else np.float64)
            assert np.array_equal(got, want.astype(got.dtype)), (value.name, n, got, want)


@pytest.mark.parametrize("bound, readable", [("[2, 2049]", True), ("[2, 2050]", False)])
def test_float_positions_are_read_only_while_exact(bound, readable):
    """f16 holds every integer up to 2048: positions cast to f16 are exact up to s0 = 2049."""
    graph = parse_ir(attention("""
        %r: i64[s0] = arange() {start=0, end=s0, step=1, dtype=i64}
        %h: f16[s0] = cast(%r) {dtype=f16}
        %row: f16[s0, 1] = reshape(%h) {shape=[s0, 1]}
        %col: f16[1, s0] = reshape(%h) {shape=[1, s0]}
        %mask: bool[s0, s0] = le(%col, %row)
    """, symbols=f"symbol s0 in {bound}"))
    assert (MaskProver(graph).why_not_causal(graph.nodes[-1]) is None) is readable


# -- simplification against brute force ------------------------------------------------------------
_S0 = symbol("s0")
_ATOM = st.tuples(st.integers(-2, 2), st.integers(-2, 2), st.integers(-4, 4),
                  st.sampled_from([sympy.Le, sympy.Lt, sympy.Eq, sympy.Ne, sympy.Ge, sympy.Gt]),
                  st.booleans())


def _atom(a, b, c, rel, sized):
    """a*i0 + b*i1 (+ s0) REL c over the index variables of an [s0, 4] tensor."""
    return rel(a * INDEX[0] + b * INDEX[1] + (_S0 if sized else 0), c)


_FORMULA = st.recursive(_ATOM.map(lambda t: _atom(*t)),
                        lambda inner: st.one_of(st.lists(inner, min_size=2, max_size=3).map(
                            lambda xs: sympy.And(*xs)), st.lists(inner, min_size=2, max_size=3).map(
                            lambda xs: sympy.Or(*xs)), inner.map(sympy.Not)), max_leaves=5)
_VALUE = st.tuples(st.integers(-3, 3), st.integers(-3, 3), st.integers(-5, 5)).map(
    lambda t: t[0] * INDEX[0] + t[1] * INDEX[1] + t[2])


@settings(max_examples=150, deadline=None)
@given(_FORMULA, _VALUE, _VALUE)
def test_simplify_agrees_with_brute_force(cond, then, other):
    """Simplification (range narrowing, pinning, atom decisions, merging) never changes a value
    at any element of an [s0, 4] tensor, for every s0 in its range [2, 6]."""
    shape, ranges = (_S0, 4), {"s0": (2, 6)}
    cases = Indexed(shape, "int", ((cond, then), (ix.negate(cond), other)))
    formula = Indexed(shape, "bool", ((sympy.true, cond),))
    for x in (cases, formula):
        simple = ix.simplify(x, ranges)
        for n in range(2, 7):
            assert np.array_equal(_elements(simple, {"s0": n}), _elements(x, {"s0": n}))


# -- whole models ----------------------------------------------------------------------------------
def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PIPELINE = ("remove_noops,fold_constants,eliminate_common_subexpressions,recognize_causal_masks,"
            "eliminate_dead_code,plan_memory")


def test_llama_compiles_to_is_causal_and_matches_eager(tmp_path):
    model, inputs, dynamic = _example("llama").build()
    path = compiler.compile(model, inputs, out=tmp_path / "llama.dz", backend="reference",
                            dynamic_shapes=dynamic, passes=PIPELINE)
    graph = parse_ir((path / "graph.dzir").read_text())
    attention_nodes = [n for n in graph.nodes if n.op == "scaled_dot_product_attention"]
    assert len(attention_nodes) == 2
    assert all(n.inputs[3] is None and n.attrs["is_causal"] for n in attention_nodes)
    assert not any(n.op in ("cumsum", "le", "bitwise_and") for n in graph.nodes)
    loaded = runtime.load(path)
    for seq in (5, 37):
        ids = torch.randint(0, 256, (1, seq), generator=torch.Generator().manual_seed(seq))
        with torch.no_grad():
            want = model(ids).numpy()
        (got,) = loaded(ids)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class _WithPadding(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          use_cache=False).logits


def _after_pass(model, inputs, dynamic):
    from passes import PassManager

    graph = compiler.export(model, inputs, dynamic_shapes=dynamic)
    PassManager(PIPELINE.removesuffix(",plan_memory")).run(graph)
    return [n for n in graph.nodes if n.op == "scaled_dot_product_attention"]


def test_gpt2_masks_are_recognized():
    nodes = _after_pass(*_example("gpt2").build())
    assert nodes and all(n.attrs["is_causal"] and n.inputs[3] is None for n in nodes)


def test_llama_with_padding_mask_input_keeps_its_mask():
    model, (ids,), _ = _example("llama").build()
    seq = torch.export.Dim("seq", min=2, max=512)
    padded = _WithPadding(model.model)
    nodes = _after_pass(padded, (ids, torch.ones_like(ids)), ({1: seq}, {1: seq}))
    assert nodes and all(not n.attrs["is_causal"] and n.inputs[3] is not None for n in nodes)
