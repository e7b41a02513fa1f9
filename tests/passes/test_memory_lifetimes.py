"""Lifetime analysis: buffers, live steps, views and in-place sharing, sizes of symbolic dims."""

from __future__ import annotations

import pytest

from compiler.errors import DayzeroError
from passes.memory import Alias, analyze_lifetimes, parse_sizes
from tests.passes.memory_util import graph, planned

CHAIN = """
    graph main {
      input %x: f32[4, 8]
      weight @w: f32[8, 8]
      %a: f32[4, 8] = matmul(%x, @w)
      %b: f32[4, 8] = exp(%a)
      %c: f32[32] = reshape(%b) {shape=[32]}
      %d: f32[4, 8] = matmul(%b, @w)
      %e: f32[4, 8] = add(%d, %b)
      %f: f32[8, 4] = permute(%e) {dims=[1, 0]}
      %g: f32[] = sum(%c) {dims=[0], keepdim=false}
      %h: f32[8, 4] = mul(%f, %g)
      return %h
    }
"""


def buffers(lifetimes):
    return [(b.value, b.size, b.nbytes, b.first, b.last) for b in lifetimes.buffers]


def test_chain_buffers_views_and_inplace_results():
    lt = analyze_lifetimes(graph(CHAIN))
    # exp overwrites %a (which dies there); the reshape views it and keeps it alive until sum
    # at step 6; add overwrites %d; the real transpose gets its own buffer; %h is an output.
    assert buffers(lt) == [("a", 128, 128, 0, 6), ("d", 128, 128, 3, 5), ("f", 128, 128, 5, 7),
                           ("g", 64, 4, 6, 7)]
    assert lt.aliases == (Alias("b", "a", 0, "inplace"), Alias("c", "a", 0, "view"),
                          Alias("e", "d", 0, "inplace"))
    assert lt.external == ("h",) and lt.steps == 8


def test_chain_plan_has_exact_offsets():
    plan = planned(graph(CHAIN))
    # %a [0, 6] and %d [3, 5] overlap in time; %f [5, 7] overlaps both; %g [6, 7] overlaps
    # %a and %f. Step 5 holds a, d, f: 384 bytes, the lower bound.
    assert [(b.value, b.offset) for b in plan.buffers] == [("a", 0), ("d", 128), ("f", 256),
                                                          ("g", 128)]
    assert (plan.arena_bytes, plan.lower_bound, plan.naive_total) == (384, 384, 448)


def test_without_inplace_every_elementwise_result_has_a_buffer():
    lt = analyze_lifetimes(graph(CHAIN), inplace=False)
    assert [b.value for b in lt.buffers] == ["a", "b", "d", "e", "f", "g"]
    assert lt.aliases == (Alias("c", "b", 0, "view"),)
    planned(graph(CHAIN), inplace=False)


def test_outputs_and_views_of_inputs_weights_outputs_stay_out_of_the_arena():
    g = graph("""
        graph main {
          input %x: f32[4, 8]
          weight @w: f32[8, 8]
          %xv: f32[32] = reshape(%x) {shape=[32]}
          %wv: f32[64] = reshape(@w) {shape=[64]}
          %a: f32[4, 8] = matmul(%x, @w)
          %out: f32[32] = reshape(%a) {shape=[32]}
          %ov: f32[4, 8] = reshape(%out) {shape=[4, 8]}
          %s: f32[] = sum(%xv) {dims=[0], keepdim=false}
          %t: f32[] = sum(%wv) {dims=[0], keepdim=false}
          %u: f32[4, 8] = mul(%ov, %s)
          %v: f32[4, 8] = mul(%u, %t)
          return %out, %v
        }
    """)
    lt = analyze_lifetimes(g)
    # %out is returned, so it is not a view of %a: %a dies at step 3 where %out is produced.
    assert buffers(lt) == [("a", 128, 128, 2, 3), ("s", 64, 4, 5, 7), ("t", 64, 4, 6, 8),
                           ("u", 128, 128, 7, 8)]
    assert set(lt.external) == {"xv", "wv", "out", "ov", "v"}
    assert lt.aliases == ()
    planned(g)


VIEWS = """
    graph main {
      input %x: f32[4, 8]
      input %y: f32[1, 8, 4]
      %a: f32[4, 8] = exp(%x)
      %b: f32[1, 8, 4] = exp(%y)
      %v: OUT = VIEW
      %r: OUT = relu(%v)
      %k: f32[4, 8] = add(%a, %a)
      %l: f32[1, 8, 4] = add(%b, %b)
      return %r, %k, %l
    }
"""

# (source, result type, view) -> byte offset in the source's buffer, or None (copied)
VIEW_CASES = [
    ("a", "f32[2, 8]", "slice(%a) {dim=0, start=1, end=3, step=1}", 32),
    ("a", "f32[2, 8]", "slice(%a) {dim=0, start=-2, end=9223372036854775807, step=1}", 64),
    ("a", "f32[2, 8]", "slice(%a) {dim=0, start=0, end=4, step=2}", None),
    ("a", "f32[4, 3]", "slice(%a) {dim=1, start=2, end=5, step=1}", None),
    ("b", "f32[1, 3, 4]", "slice(%b) {dim=1, start=2, end=5, step=1}", 32),
    ("a", "f32[8]", "select(%a) {dim=0, index=-1}", 96),
    ("a", "f32[4]", "select(%a) {dim=1, index=2}", None),
    ("b", "f32[1, 4]", "select(%b) {dim=1, index=3}", 48),
    ("a", "f32[8, 4]", "reshape(%a) {shape=[8, 4]}", 0),
    ("a", "f32[1, 4, 8]", "expand(%a) {shape=[1, 4, 8]}", 0),
    ("a", "f32[2, 4, 8]", "expand(%a) {shape=[2, 4, 8]}", None),
    ("b", "f32[8, 1, 4]", "permute(%b) {dims=[1, 0, 2]}", 0),
    ("b", "f32[1, 4, 8]", "permute(%b) {dims=[0, 2, 1]}", None),
]


@pytest.mark.parametrize("source,out,view,offset", VIEW_CASES,
                         ids=[c[2].split(")")[0] + ")" + c[2].split("}")[0][-14:]
                              for c in VIEW_CASES])
def test_a_view_shares_its_source_only_as_one_contiguous_range(source, out, view, offset):
    g = graph(VIEWS.replace("OUT", out).replace("VIEW", view))
    lt = analyze_lifetimes(g)
    shared = {a.value: a for a in lt.aliases}
    if offset is None:
        assert "v" in [b.value for b in lt.buffers] and "v" not in shared
    else:
        assert shared["v"] == Alias("v", source, offset, "view")
    planned(g)


INPLACE = """
    graph main {
      input %x: f32[4, 8]
      input %s: f32[4, 1]
      %a: f32[4, 8] = exp(%x)
      %c: f32[4, 1] = exp(%s)
      %o: TYPE = OP
      return %o, %k
    }
"""


@pytest.mark.parametrize("op,type,later,reuses", [
    ("mul(%a, %c)", "f32[4, 8]", "", "a"),               # %a dies here and has the result's shape
    ("mul(%c, %a)", "f32[4, 8]", "", "a"),               # %c is broadcast: never overwritten
    ("relu(%a)", "f32[4, 8]", "%a", None),               # %a is read later
    ("gt(%a, %c)", "bool[4, 8]", "", None),              # a bool is 1 byte, %a's elements 4
    ("cast(%a) {dtype=i32}", "i32[4, 8]", "", "a"),      # same element size
    ("sum(%a) {dims=[1], keepdim=true}", "f32[4, 1]", "", None),  # not elementwise
])
def test_inplace_needs_an_elementwise_op_and_an_operand_that_dies(op, type, later, reuses):
    tail = f"%k: f32[4, 8] = add({later}, {later})" if later else "%k: f32[4, 1] = neg(%c)"
    text = INPLACE.replace("%o: TYPE = OP", f"%o2: {type} = {op}\n  %o: {type} = "
                           f"{'neg' if not type.startswith('bool') else 'logical_not'}(%o2)")
    text = text.replace("return %o, %k", f"{tail}\n  return %o, %k")
    g = graph(text)
    lt = analyze_lifetimes(g)
    shared = {a.value: a.root for a in lt.aliases if a.kind == "inplace"}
    assert shared.get("o2") == reuses
    planned(g)


def test_inplace_refused_when_another_operand_reads_the_buffer_differently():
    g = graph("""
        graph main {
          input %x: f32[2, 8]
          %a: f32[2, 8] = exp(%x)
          %v: f32[1, 8] = slice(%a) {dim=0, start=1, end=2, step=1}
          %o: f32[2, 8] = add(%a, %v)
          %p: f32[2, 8] = neg(%o)
          return %p
        }
    """)
    lt = analyze_lifetimes(g)
    assert Alias("v", "a", 32, "view") in lt.aliases
    assert "o" in [b.value for b in lt.buffers]  # writing row 0 of %a would clobber %v's row
    planned(g)


SYMBOLIC = """
    graph main {
      symbol s0 in [1, 32]
      symbol s1 in [2, 8]
      input %x: f32[s0, 16]
      input %y: f32[s1, s0]
      %a: f32[s0, 16] = exp(%x)
      %b: f32[s1, s0] = exp(%y)
      %c: f32[s0, s1] = permute(%b) {dims=[1, 0]}
      %o: f32[s0, 16] = add(%a, %a)
      return %o, %c
    }
"""


def test_symbolic_sizes_default_to_upper_bounds_or_given_values():
    g = graph(SYMBOLIC)
    assert buffers(analyze_lifetimes(g)) == [("a", 2048, 2048, 0, 3), ("b", 1024, 1024, 1, 2)]
    small = analyze_lifetimes(g, sizes={"s0": 3})
    assert small.sizes == {"s0": 3, "s1": 8}
    assert buffers(small) == [("a", 192, 192, 0, 3), ("b", 128, 96, 1, 2)]
    assert planned(g, sizes={"s0": 3, "s1": 2}).arena_bytes == 192 + 64
    assert planned(g, alignment=16, sizes={"s0": 3, "s1": 3}).arena_bytes == 192 + 48


@pytest.mark.parametrize("sizes,message", [
    ({"s0": 33}, "outside its range [1, 32]"),
    ({"s9": 4}, "unknown symbol(s) s9"),
])
def test_bad_sizes_are_clear_errors(sizes, message):
    with pytest.raises(DayzeroError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        analyze_lifetimes(graph(SYMBOLIC), sizes=sizes)


def test_an_unbounded_symbol_needs_a_size():
    g = graph("""
        graph main {
          symbol s0 in [1, inf]
          input %x: f32[s0, 4]
          %a: f32[s0, 4] = exp(%x)
          %o: f32[s0, 4] = neg(%a)
          return %o
        }
    """)
    with pytest.raises(DayzeroError, match="s0 has no upper bound") as err:
        analyze_lifetimes(g)
    assert "sizes=s0:" in err.value.fix
    assert planned(g, sizes={"s0": 10}).arena_bytes == 192


def test_parse_sizes():
    assert parse_sizes("") == {}
    assert parse_sizes("s0:128;s1:16") == {"s0": 128, "s1": 16}
    for bad in ("s0", "s0:x", "0s:4", "s0=4"):
        with pytest.raises(DayzeroError, match="is not SYMBOL:VALUE"):
            parse_sizes(bad)
