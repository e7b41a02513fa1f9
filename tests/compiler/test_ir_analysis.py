"""Named analyses (compiler/ir/analysis.py): computed once, cached on the graph, dropped when the
graph changes, printed as comments that the parser skips."""

from __future__ import annotations

from textwrap import dedent

import pytest

from compiler.ir import DType, TensorType, parse_ir, print_ir
from compiler.ir.analysis import ANALYSES, describe, mark_changed, register_analysis

TEXT = dedent("""\
    graph main {
      input %x: f32[4]
      weight @w: f32[4]
      weight @unused: f32[4]
      %a: f32[4] = add(%x, @w)
      %dead: f32[4] = neg(%a)
      %b: f32[4] = exp(%a)
      return %b
    }
    """)
F32 = TensorType(DType.f32, (4,))


@pytest.fixture
def calls():
    """Registers `test_count` (the number of nodes times `scale`), recording each run."""
    runs: list[int] = []

    @register_analysis("test_count", "nodes times scale", lambda g, r: [f"{r} nodes", "x"])
    def count(graph, scale=1):
        runs.append(scale)
        return len(graph.nodes) * scale

    yield runs
    ANALYSES.pop("test_count")


def test_cached_until_the_graph_changes_one_entry_per_options(calls):
    graph = parse_ir(TEXT)
    assert graph.analysis("test_count") == 3
    assert graph.analysis("test_count") == 3
    assert calls == [1]
    assert graph.analysis("test_count", scale=2) == 6
    assert graph.analysis("test_count", scale=2) == 6 and graph.analysis("test_count") == 3
    assert calls == [1, 2]


def _value(graph, name):
    return next(v for v in graph.values() if v.name == name)


MUTATIONS = {
    "add_input": lambda g: g.add_input("y", F32),
    "add_weight": lambda g: g.add_weight("v", F32),
    "add_node": lambda g: g.add_node("neg", [_value(g, "b")]),
    "replace_uses": lambda g: g.replace_uses(_value(g, "b"), _value(g, "a")),
    "remove_nodes": lambda g: g.remove_nodes([_value(g, "dead").producer]),
    "remove_unused_weights": lambda g: g.remove_unused_weights(),
}


@pytest.mark.parametrize("method", sorted(MUTATIONS))
def test_every_mutation_method_makes_the_analysis_run_again(calls, method):
    graph = parse_ir(TEXT)
    graph.analysis("test_count")
    MUTATIONS[method](graph)
    expected = 2 if method == "remove_nodes" else 4 if method == "add_node" else 3
    assert graph.analysis("test_count") == expected
    assert calls == [1, 1]


def test_a_call_that_changes_nothing_keeps_the_result(calls):
    graph = parse_ir(TEXT)
    graph.remove_unused_weights()
    graph.analysis("test_count")
    assert graph.remove_unused_weights() is False
    graph.analysis("test_count")
    assert calls == [1]


def test_mark_changed_drops_all_but_what_is_preserved_since_a_version(calls):
    graph = parse_ir(TEXT)
    graph.analysis("test_count", scale=5)
    graph.add_input("y", F32)  # now stale, before the "pass" starts
    since = graph.version
    graph.analysis("test_count")  # computed during the "pass"
    graph.nodes = graph.nodes[:-1]  # an edit no method sees
    mark_changed(graph, preserve=["test_count"], since=since)
    assert graph.analysis("test_count") == 3  # preserved: the pass vouches for it
    assert graph.analysis("test_count", scale=5) == 10  # stale before the pass: recomputed
    assert calls == [5, 1, 5]
    mark_changed(graph)
    assert graph.analysis("test_count") == 2 and calls == [5, 1, 5, 1]


def test_current_results_print_as_comments_the_parser_skips(calls):
    graph = parse_ir(TEXT)
    assert describe(graph) == ""
    graph.analysis("test_count", scale=2)
    graph.analysis("test_count")
    block = describe(graph)
    assert block == ("# analysis test_count:\n#   3 nodes\n#   x\n"
                     "# analysis test_count{scale=2}:\n#   6 nodes\n#   x\n")
    assert print_ir(parse_ir(print_ir(graph) + block)) == print_ir(graph)
    graph.add_input("y", F32)
    assert describe(graph) == ""


def test_unknown_analysis_names_the_registered_ones():
    with pytest.raises(KeyError, match="no analysis named 'nope'"):
        parse_ir(TEXT).analysis("nope")
