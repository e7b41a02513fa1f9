"""Use-lists and node positions: every Graph mutation method keeps `Value.uses` equal to what a
scan of the graph finds, `Graph.users()` equals the old whole-graph scan, and `Graph.index`
finds nodes after insertions, removals and reorders."""

from __future__ import annotations

from textwrap import dedent

import pytest

from compiler.ir import DType, Graph, TensorType, Value, parse_ir, verify
from compiler.ir.graph import Node

F32 = TensorType(DType.f32, (4,))


def scanned_uses(graph: Graph) -> dict:
    """{value: [(node, operand index), ...]} by scanning every node, in graph order."""
    table: dict = {}
    for node in graph.nodes:
        for i, value in enumerate(node.inputs):
            if value is not None:
                table.setdefault(value, []).append((node, i))
    return table


def scanned_users(graph: Graph) -> dict:
    """What `Graph.users()` returned before use-lists: a scan of every node's operands."""
    return {v: [n for n, _ in uses] for v, uses in scanned_uses(graph).items()}


def assert_consistent(graph: Graph) -> None:
    scanned = scanned_uses(graph)
    for value in graph.values():
        key = lambda use: (id(use[0]), use[1])  # noqa: E731
        assert sorted(value.uses, key=key) == sorted(scanned.get(value, []), key=key), value
    assert graph.users() == scanned_users(graph)
    assert [graph.index(n) for n in graph.nodes] == list(range(len(graph.nodes)))
    verify(graph)


def chain(length: int = 3):
    """x -> neg -> neg -> ... ; w added to the last; returns (graph, x, w, nodes)."""
    g = Graph("g")
    x = g.add_input("x", F32)
    w = g.add_weight("w", F32)
    nodes, v = [], x
    for i in range(length):
        node = g.add_node("neg", [v], names=[f"n{i}"])
        nodes.append(node)
        v = node.output
    last = g.add_node("add", [v, w], names=["out"])
    g.outputs = [last.output]
    return g, x, w, nodes + [last]


def test_add_node_records_each_operand_once_per_slot():
    g, x, w, nodes = chain()
    both = g.add_node("mul", [x, x], names=["sq"], before=nodes[0])
    assert x.uses == [(nodes[0], 0), (both, 0), (both, 1)]
    assert x.users == [nodes[0], both]
    assert g.nodes[0] is both
    g.outputs.append(both.output)
    assert_consistent(g)


def test_set_input_moves_one_use():
    g, x, w, nodes = chain()
    g.set_input(nodes[1], 0, x)
    assert (nodes[1], 0) in x._uses and nodes[0].output.uses == []
    g.set_input(nodes[1], 0, nodes[0].output)
    assert x.uses == [(nodes[0], 0)]
    assert_consistent(g)


def test_set_input_to_absent_and_back():
    g = Graph("g")
    x = g.add_input("x", TensorType(DType.f32, (2, 4)))
    wt = g.add_weight("w", TensorType(DType.f32, (3, 4)))
    b = g.add_weight("b", TensorType(DType.f32, (3,)))
    lin = g.add_node("linear", [x, wt, b])
    g.outputs = [lin.output]
    g.set_input(lin, 2, None)
    assert b.uses == [] and lin.inputs[2] is None
    g.set_input(lin, 2, b)
    assert b.uses == [(lin, 2)]
    assert_consistent(g)


def test_replace_uses_rewires_readers_and_outputs():
    g, x, w, nodes = chain()
    old = nodes[-1].output
    other = g.add_node("neg", [old], names=["later"])
    g.outputs.append(old)
    new = g.add_node("neg", [w], names=["fresh"], before=nodes[-1])
    g.replace_uses(old, new.output)
    assert old.uses == [] and (other, 0) in new.output._uses
    assert g.outputs == [new.output, new.output]
    g.replace_uses(new.output, new.output)  # no-op
    assert_consistent(g)


@pytest.mark.parametrize("many", [False, True])
def test_remove_nodes_drops_their_reads(many):
    g, x, w, nodes = chain(40 if many else 3)
    doomed = nodes[1:-1]
    g.set_input(nodes[-1], 0, nodes[0].output)
    g.remove_nodes(doomed + doomed[:1])  # duplicates and order do not matter
    assert g.nodes == [nodes[0], nodes[-1]]
    assert nodes[0].output.uses == [(nodes[-1], 0)]
    g.remove_nodes([doomed[0]])  # not in the graph any more: ignored
    assert_consistent(g)


def test_set_nodes_reorders_and_drops():
    g, x, w, nodes = chain()
    spare = g.add_node("neg", [x], names=["spare"])
    g.nodes = [n for n in g.nodes if n is not spare]  # the setter is set_nodes
    assert x.uses == [(nodes[0], 0)]
    assert_consistent(g)
    g.set_nodes(list(g.nodes))
    assert_consistent(g)


def test_parsed_graph_has_use_lists():
    g = parse_ir(dedent("""
        graph main {
          input %x: f32[4]
          %a: f32[4] = neg(%x)
          %b: f32[4] = add(%a, %x)
          return %b
        }
    """))
    a, b = g.nodes
    assert g.inputs[0].uses == [(a, 0), (b, 1)] and a.output.users == [b]
    assert_consistent(g)


def test_index_survives_many_insertions_at_one_place():
    g, x, w, nodes = chain(2)
    anchor, made = nodes[1], []
    for i in range(200):  # more than the key gap can halve: forces renumbering
        made.append(g.add_node("neg", [x], names=[f"m{i}"], before=anchor))
    assert g.nodes[1:201] == made
    assert g.index(anchor) == 201
    assert_consistent(g)


def test_index_after_the_list_was_changed_directly():
    g, x, w, nodes = chain(3)
    g.nodes.reverse()  # behind the graph's back: positions are found by a scan once
    assert g.index(nodes[0]) == len(nodes) - 1
    g.nodes.reverse()
    assert g.index(nodes[0]) == 0
    with pytest.raises(ValueError):
        g.index(Node("neg", [x], {}, [Value("stray", F32)]))


def test_users_keeps_graph_order_after_insertions():
    g, x, w, nodes = chain(2)
    late = g.add_node("neg", [x], names=["late"])
    early = g.add_node("neg", [x], names=["early"], before=nodes[0])
    assert g.users()[x] == [early, nodes[0], late]  # graph order, not insertion order
    assert x.users == [nodes[0], late, early]  # the use-list itself: insertion order
