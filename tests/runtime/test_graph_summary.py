"""graph.dzir read without the IR parser (runtime.graph_summary): the same signature, symbols
and index ranges as the parsed graph, and an ArtifactError naming the line for anything else."""

from __future__ import annotations

import pytest
import torch

from compiler.errors import ArtifactError
from compiler.ir import DType, Graph, TensorType, parse_ir, print_ir, symbol, symbolic
from runtime.graph_summary import summarize
from runtime.index_inputs import index_inputs_json
from tests.runtime.conftest import mlp_graph
from tests.runtime.test_artifact_consistency import vocab_graph


def odd_graph() -> Graph:
    """Quoted names, a two-result node, dims with commas inside calls, an index_select by
    `dim`, an advanced index, a view and a cast of the ids, a weight and an input returned."""
    g = Graph("odd graph")
    g.symbols["s0"] = (2, 40)
    ids = g.add_input('ids "q", x', TensorType(DType.i32, (symbol("s0"),)))
    x = g.add_input("x", TensorType(DType.f32, (symbol("s0"), 6)))
    rows = g.add_weight("rows.w", TensorType(DType.f32, (6, 10)), torch.zeros(6, 10))
    table = g.add_weight("t{b}", TensorType(DType.f32, (7, 3)), torch.zeros(7, 3))
    wide = g.add_node("cast", [ids], {"dtype": DType.i64}, names=["wide"]).output
    view = g.add_node("reshape", [wide], {"shape": [1, symbol("s0")]}, names=["v"]).output
    picked = g.add_node("index_select", [rows, wide], {"dim": 1}, names=["p"]).output
    looked = g.add_node("index", [table, view], names=["looked"]).output
    top = g.add_node("topk", [x], {"k": 2, "dim": -1, "largest": True, "sorted": True},
                     names=["mx", "arg"])
    g.outputs = [picked, looked, *top.outputs, x, rows]
    return g


def _signature(graph: Graph) -> tuple:
    def spec(v):
        return v.name, v.type.dtype.value, tuple(
            d if isinstance(d, (int, str)) else symbolic.dim_str(d) for d in v.type.shape)
    return [spec(v) for v in graph.inputs], [spec(v) for v in graph.outputs], dict(graph.symbols)


@pytest.mark.parametrize("make", [mlp_graph, vocab_graph, odd_graph])
def test_the_summary_is_the_parsed_graphs_signature(make):
    text = print_ir(make())
    graph = parse_ir(text)
    summary = summarize(text, "m.dz/graph.dzir")
    assert _signature(summary) == _signature(graph)
    assert index_inputs_json(summary) == index_inputs_json(graph)


def test_the_odd_graph_has_its_index_ranges():
    ranges = index_inputs_json(summarize(print_ir(odd_graph()), "g"))
    # the tightest of its two lookups: index_select along dim 1 (10 rows), not index (7 rows,
    # [-7, 7): 14 values)
    assert ranges == {'ids "q", x': {"lo": 0, "hi": 10, "table": "rows.w",
                                     "op": "index_select"}}


@pytest.mark.parametrize("old, new, words", [
    ("input %x: f32[s0, 6]", "input %x: q32[s0, 6]", "line 4 has the unknown dtype 'q32'"),
    ("input %x: f32[s0, 6]", "input @x: f32[s0, 6]", "line 4 declares input @x"),
    ("  return", "  # a comment\n  return", "line 12 is not a statement"),
    ("  return %p", "  return %nowhere, %p", "returns %nowhere, which is never defined"),
    ("\n}\n", "\n  %z: f32[1] = relu(%x)\n}\n", "follows the return statement"),
    ("%wide:", '%"\\q":', "has the unreadable name"),
    ("%wide:", '%"\\ud800":', "has the unreadable name"),
    ("  return %p, %looked, %mx, %arg, %x, @rows.w\n", "", "has no return statement"),
    ("graph", "grph", "is not a graph"),
])
def test_a_graph_text_not_in_the_printed_form_is_an_artifact_error(old, new, words):
    text = print_ir(odd_graph())
    assert old in text
    with pytest.raises(ArtifactError, match="graph.dzir") as info:
        summarize(text.replace(old, new, 1), "m.dz/graph.dzir")
    assert words in info.value.what, info.value.what


def test_a_long_graph_is_read_in_linear_time():
    import time

    text = print_ir(vocab_graph())
    head, _, tail = text.partition("  %e:")
    body = "".join(f"  %r{i}: f32[1, s0, 5] = relu(%logits)\n" for i in range(20000))
    start = time.perf_counter()
    summary = summarize(head + "  %e:" + tail.replace("  return", body + "  return"), "g")
    assert len(summary.nodes) == 20002 and time.perf_counter() - start < 5
