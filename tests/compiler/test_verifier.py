"""The verifier rejects each broken invariant, naming the node (as IR text) and its source loc."""

from __future__ import annotations

import pytest

from compiler.errors import VerificationError
from compiler.ir import DType, Graph, TensorType, Value, symbol, verify

S0 = symbol("s0")
LOC = "model.py:12 in forward"


def _graph():
    """x -> add(x, x) -> sum; with a weight, a symbol and a loc on every node."""
    g = Graph("g")
    g.symbols["s0"] = (1, 32)
    x = g.add_input("x", TensorType(DType.f32, (S0, 4)))
    w = g.add_weight("layer.w", TensorType(DType.f32, (4,)))
    add = g.add_node("add", [x, w], loc=LOC, names=["h"])
    red = g.add_node("sum", [add.output], {"dims": [1]}, loc=LOC + "+1", names=["r"])
    g.outputs = [red.output]
    return g, add, red


def _error(g: Graph) -> VerificationError:
    with pytest.raises(VerificationError) as info:
        verify(g)
    return info.value


def _assert_names_node(err: VerificationError, text: str, loc: str):
    assert err.where.startswith(f"node `{text}"), err.message()
    assert loc in err.where, err.message()


def test_valid_graph_passes():
    g, _, _ = _graph()
    verify(g)


def test_use_before_def():
    g, add, red = _graph()
    g.nodes = [red, add]
    err = _error(g)
    assert "operand h is not defined before this node" in err.what
    _assert_names_node(err, "%r: f32[s0] = sum(%h) {dims=[1], keepdim=false}", LOC + "+1")
    assert "topological order" in err.fix


def test_operand_from_another_graph():
    g, add, red = _graph()
    other, _, _ = _graph()
    red.inputs = [other.nodes[0].output]
    err = _error(g)
    assert "operand h is not defined" in err.what
    _assert_names_node(err, "%r: f32[s0] = sum(%h) {dims=[1], keepdim=false}", LOC + "+1")


def test_operand_of_a_removed_node():
    g, add, red = _graph()
    g.remove_nodes([add])
    err = _error(g)
    assert "operand h is not defined" in err.what
    assert LOC + "+1" in err.where


def test_operand_that_is_a_free_value():
    g, add, red = _graph()
    red.inputs = [Value("h", add.output.type)]
    assert "operand h is not defined" in _error(g).what


def test_weight_of_another_graph_with_the_same_name():
    g, add, red = _graph()
    other, _, _ = _graph()
    add.inputs = [g.inputs[0], other.weights["layer.w"]]
    err = _error(g)
    assert "operand layer.w is not defined" in err.what
    _assert_names_node(err, "%h: f32[s0, 4] = add(%x, %layer.w)", LOC)


def test_duplicate_value_name():
    g, add, red = _graph()
    add.outputs[0].name = "x"  # clashes with the input
    err = _error(g)
    assert "value %x is defined twice" in err.what
    assert LOC in err.where and "add(%x, @layer.w)" in err.where


def test_value_defined_by_two_nodes():
    g, add, red = _graph()
    dup = g.add_node("sum", [add.output], {"dims": [1]}, loc="dup.py:1")
    dup.outputs = [red.output]  # one Value object as the output of two nodes
    err = _error(g)
    assert "value %r is defined twice" in err.what
    assert "dup.py:1" in err.where


def test_value_whose_producer_is_another_node():
    g, add, red = _graph()
    red.output.producer = add
    err = _error(g)
    assert "value %r does not point back at its producer" in err.what
    assert LOC + "+1" in err.where


def test_wrong_result_type():
    g, add, red = _graph()
    add.outputs[0].type = TensorType(DType.f32, (S0, 5))
    err = _error(g)
    assert "result %h has type f32[s0, 5], but add gives f32[s0, 4]" in err.what
    _assert_names_node(err, "%h: f32[s0, 5] = add(%x, @layer.w)", LOC)


def test_wrong_result_dtype():
    g, add, red = _graph()
    red.outputs[0].type = TensorType(DType.f16, (S0,))
    err = _error(g)
    assert "has type f16[s0], but sum gives f32[s0]" in err.what
    assert LOC + "+1" in err.where


def test_wrong_number_of_results():
    g, add, red = _graph()
    extra = Value("extra", add.output.type, add)
    add.outputs.append(extra)
    err = _error(g)
    assert "add gives 1 results, node has 2" in err.what
    assert LOC in err.where


def test_operand_types_the_op_rejects():
    g, add, red = _graph()
    bad = g.add_weight("bad", TensorType(DType.i64, (4,)))
    add.inputs = [g.inputs[0], bad]
    err = _error(g)
    assert "add: elementwise op needs operands of one dtype" in err.what
    assert LOC in err.where


def test_wrong_arity():
    g, add, red = _graph()
    red.inputs = [add.output, add.output]
    err = _error(g)
    assert "sum takes inputs (x), got 2" in err.what
    assert LOC + "+1" in err.where


def test_unknown_op():
    g, add, red = _graph()
    red.op = "frobnicate"
    err = _error(g)
    assert "unknown op 'frobnicate'" in err.what
    assert "frobnicate(%h)" in err.where and LOC + "+1" in err.where


def test_missing_required_attr():
    g, add, red = _graph()
    sl = g.add_node("slice", [add.output], {"dim": 1, "end": 2}, loc="slice.py:3")
    g.outputs = [sl.output]
    del sl.attrs["end"]
    err = _error(g)
    assert "slice needs attribute end" in err.what
    assert "slice.py:3" in err.where and "slice(%h)" in err.where


def test_missing_default_attr():
    g, add, red = _graph()
    del red.attrs["keepdim"]
    err = _error(g)
    assert "sum attributes are incomplete" in err.what
    assert err.fix == "fill in the defaults"
    _assert_names_node(err, "%r: f32[s0] = sum(%h) {dims=[1]}", LOC + "+1")


def test_unknown_attr():
    g, add, red = _graph()
    red.attrs["axis"] = 1
    err = _error(g)
    assert "sum has no attribute(s) ['axis']" in err.what
    assert LOC + "+1" in err.where


def test_undeclared_symbol_in_an_input():
    g, _, _ = _graph()
    del g.symbols["s0"]
    err = _error(g)
    assert "size symbol(s) ['s0'] are not declared" in err.what


def test_undeclared_symbol_in_a_result():
    g, add, red = _graph()
    full = g.add_node("full", [], {"shape": [symbol("s1")], "value": 0.0, "dtype": DType.f32},
                      loc="make.py:9")
    g.outputs.append(full.output)
    err = _error(g)
    assert "size symbol(s) ['s1'] are not declared in the graph" in err.what
    assert "make.py:9" in err.where and "full()" in err.where


def test_undeclared_symbol_in_a_weight():
    g, _, _ = _graph()
    g.add_weight("w2", TensorType(DType.f32, (symbol("s7"),)))
    assert "['s7'] are not declared" in _error(g).what


def test_weight_table_key_mismatch():
    g, _, _ = _graph()
    g.weights["renamed"] = g.weights.pop("layer.w")
    assert "weight table key renamed names value layer.w" in _error(g).what


def test_graph_output_of_a_removed_node():
    g, add, red = _graph()
    g.remove_nodes([red])
    err = _error(g)
    assert "graph output r is not defined in the graph" in err.what


def test_graph_output_from_another_graph():
    g, _, _ = _graph()
    other, _, _ = _graph()
    g.outputs = [other.outputs[0]]
    assert "graph output r is not defined" in _error(g).what


def test_graph_output_missing():
    g, _, _ = _graph()
    g.outputs = [g.outputs[0], None]
    assert "graph output 1 is missing" in _error(g).what


def test_node_without_loc_is_still_named():
    g, add, red = _graph()
    red.loc = None
    red.attrs["axis"] = 1
    err = _error(g)
    assert err.where == "node `%r: f32[s0] = sum(%h) {dims=[1], keepdim=false, axis=1}`"


def test_message_has_what_where_and_fix_lines():
    g, add, red = _graph()
    g.nodes = [red, add]
    lines = str(_error(g)).splitlines()
    assert lines[0].startswith("operand h")
    assert lines[1].startswith("  where: node `%r")
    assert lines[2].startswith("  fix: ")


def test_an_operand_changed_behind_the_graphs_back_breaks_the_use_lists():
    g, add, red = _graph()
    red.inputs[0] = g.inputs[0]  # not through Graph.set_input: x's use-list misses it
    err = _error(g)
    assert "the use-list of %x misses operand 0 of this node" in err.what
    _assert_names_node(err, "%r: f32[s0] = sum(%x)", LOC + "+1")
    assert "set_input" in err.fix


def test_a_stale_use_is_reported():
    g, add, red = _graph()
    g.set_input(red, 0, add.output)  # no change: still consistent
    verify(g)
    add.output._uses[(red, 5)] = None
    assert "names operand 5 of this node, which reads something else" in _error(g).what


def test_a_use_by_a_node_outside_the_graph_is_reported():
    g, add, red = _graph()
    other = Graph("other")
    other.add_node("neg", [add.output])  # another graph reading this graph's value
    assert "names a node that is not in the graph" in _error(g).what
