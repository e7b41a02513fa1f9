"""The dataflow walker (compiler/ir/dataflow.py): IR text in, a fact per value out."""

from __future__ import annotations

from textwrap import dedent

from compiler.ir import parse_ir
from compiler.ir.dataflow import LazyForward, ancestry, backward, forward

TEXT = dedent("""\
    graph main {
      input %x: f32[4]
      input %y: f32[4]
      weight @w: f32[4]
      %a: f32[4] = add(%x, @w)
      %b: f32[4] = mul(%a, %a)
      %c: f32[4] = exp(@w)
      %d: f32[4] = add(%b, %c)
      %dead: f32[4] = neg(%y)
      %e: f32[4] = sub(%d, %x)
      return %e, %c
    }
    """)


def _inputs_read(node, args):
    """Forward fact: the graph inputs a value depends on."""
    return [frozenset().union(*(a for a in args if a is not None))] * len(node.outputs)


def _source(graph):
    return lambda v: frozenset() if graph.is_weight(v) else frozenset([v.name])


def _named(facts, show=sorted):
    return {v.name: show(f) for v, f in facts.items()}


def test_forward_facts_in_node_order():
    graph = parse_ir(TEXT)
    facts = forward(graph.nodes, _inputs_read, _source(graph))
    assert _named(facts) == {"x": ["x"], "w": [], "a": ["x"], "b": ["x"], "c": [], "d": ["x"],
                             "y": ["y"], "dead": ["y"], "e": ["x"]}


def test_forward_stops_before_a_node_and_keeps_seeds():
    graph = parse_ir(TEXT)
    x = graph.inputs[0]
    seeded = {x: frozenset(["seed"])}
    facts = forward(graph.nodes, _inputs_read, _source(graph), seeded, stop=graph.nodes[3])
    assert facts is seeded
    assert _named(facts) == {"x": ["seed"], "w": [], "a": ["seed"], "b": ["seed"], "c": []}


def test_backward_needed_values_and_last_readers():
    graph = parse_ir(TEXT)
    outputs = set(graph.outputs)
    needed = backward(graph.nodes, lambda node, outs: [any(outs)] * len(node.inputs),
                      lambda v: v in outputs, lambda a, b: a or b)
    assert _named(needed, bool) == {"e": True, "c": True, "dead": False, "y": False, "d": True,
                                    "x": True, "b": True, "a": True, "w": True}
    step = {node: k for k, node in enumerate(graph.nodes)}
    last = backward(graph.nodes, lambda node, outs: [step[node]] * len(node.inputs),
                    lambda v: -1, max)
    assert _named(last, int) == {"e": -1, "c": 3, "dead": -1, "y": 4, "d": 5, "x": 5,
                                 "b": 3, "a": 1, "w": 2}


def test_ancestry_in_topological_order_stopping_at_known_values_and_bounded():
    graph = parse_ir(TEXT)
    values = {v.name: v for v in graph.values()}
    names = [n.outputs[0].name for n in ancestry([values["e"]])]
    assert sorted(names) == ["a", "b", "c", "d", "e"]
    assert names.index("a") < names.index("b") < names.index("d") < names.index("e")
    assert names.index("c") < names.index("d")
    known = {values["b"]}
    assert sorted(n.outputs[0].name for n in ancestry([values["e"]], known.__contains__)) == \
        ["c", "d", "e"]
    assert ancestry([values["e"]], limit=4) is None
    assert len(ancestry([values["e"]], limit=5)) == 5
    assert ancestry([values["x"], values["w"]]) == []


def test_lazy_forward_runs_each_transfer_once_and_matches_the_eager_walk():
    graph = parse_ir(TEXT)
    calls = []

    def transfer(node, args):
        calls.append(node.outputs[0].name)
        return _inputs_read(node, args)

    lazy = LazyForward(transfer, _source(graph))
    values = {v.name: v for v in graph.values()}
    assert lazy.of(values["b"]) == {"x"}
    assert calls == ["a", "b"]
    assert lazy.of(values["e"]) == {"x"} and lazy.of(values["c"]) == frozenset()
    assert sorted(calls) == ["a", "b", "c", "d", "e"]  # a and b were not walked again
    assert lazy.of(values["y"]) == {"y"} and len(calls) == 5  # a source: no transfer
    eager = forward(graph.nodes, _inputs_read, _source(graph))
    assert all(lazy.of(v) == eager[v] for v in graph.values())
