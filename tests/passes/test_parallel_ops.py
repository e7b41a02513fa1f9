"""The collective ops: shape rules in global and local form, text round trip, semantics."""

from __future__ import annotations

import pytest
import torch

from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, TensorType, get_op, parse_ir, symbol
from compiler.ir.ops import ShapeError
from tests.passes.parallel_util import run_ranks

S0 = symbol("s0")
X = TensorType(DType.f32, (S0, 4))

ALL_OPS = """\
graph g {
  symbol s0 in [2, 8]
  input %x: f32[s0, 4]
  %a: f32[s0, 4] = shard(%x) {layout="tp:S1"}
  %b: f32[s0, 4] = all_reduce(%a) {axis="tp", ranks=none}
  %c: f32[s0, 8] = all_gather(%b) {axis="tp", dim=1, ranks=[0, 1]}
  %d: f32[s0, 4] = reduce_scatter(%c) {axis="tp", dim=1, ranks=[0, 1]}
  %e: f32[s0, 4] = send(%d) {peer=1, tag=0}
  %f: f32[s0, 4] = recv() {shape=[s0, 4], dtype=f32, peer=1, tag=0}
  return %f
}
"""


def test_every_collective_prints_and_parses_back(roundtrip):
    roundtrip(ALL_OPS)


@pytest.mark.parametrize("op,attrs,shape", [
    ("all_reduce", {"axis": "tp", "ranks": [0, 1, 2]}, (S0, 4)),
    ("all_gather", {"axis": "tp", "dim": 1, "ranks": None}, (S0, 4)),  # global form: same type
    ("all_gather", {"axis": "tp", "dim": 0, "ranks": [4, 5]}, (2 * S0, 4)),
    ("reduce_scatter", {"axis": "tp", "dim": 1, "ranks": [0, 1]}, (S0, 2)),
    ("reduce_scatter", {"axis": "dp", "dim": 1, "ranks": None}, (S0, 4)),
    ("send", {"peer": 3, "tag": 7}, (S0, 4)),
])
def test_collective_shape_rules(op, attrs, shape):
    opdef = get_op(op)
    assert opdef.infer([X], opdef.complete_attrs(attrs)) == [X.with_shape(shape)]


def test_recv_type_comes_from_its_attributes():
    opdef = get_op("recv")
    attrs = {"shape": [S0, 3], "dtype": DType.bf16, "peer": 0, "tag": 1}
    assert opdef.infer([], attrs) == [TensorType(DType.bf16, (S0, 3))]


def test_bad_collective_attributes_are_shape_errors():
    with pytest.raises(ShapeError, match="does not split into 3"):
        get_op("reduce_scatter").infer([X], {"axis": "tp", "dim": 1, "ranks": [0, 1, 2]})
    with pytest.raises(ShapeError, match="ranks must be a list"):
        get_op("all_reduce").infer([X], {"axis": "tp", "ranks": "0,1"})
    with pytest.raises(ShapeError, match="layout must be a string"):
        get_op("shard").infer([X], {"layout": 3})
    with pytest.raises(ShapeError, match="needs attribute dim"):
        get_op("all_gather").complete_attrs({"axis": "tp"})


def _collective_graph(op: str, **attrs) -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 4)))
    g.outputs = [g.add_node(op, [x], attrs).output]
    return g


@pytest.mark.parametrize("op,attrs,want", [
    ("all_reduce", {"axis": "tp", "ranks": [0, 1]},
     lambda xs, r: xs[0] + xs[1]),
    ("all_gather", {"axis": "tp", "dim": 1, "ranks": [0, 1]},
     lambda xs, r: torch.cat(xs, dim=1)),
    ("reduce_scatter", {"axis": "tp", "dim": 1, "ranks": [0, 1]},
     lambda xs, r: (xs[0] + xs[1])[:, 2 * r:2 * r + 2]),
])
def test_collective_semantics_on_two_ranks(op, attrs, want):
    graph = _collective_graph(op, **attrs)
    inputs = [torch.randn(2, 4), torch.randn(2, 4)]
    outputs = run_ranks(2, lambda r: run_graph(graph, {}, [inputs[r]])[0])
    for rank, got in enumerate(outputs):
        torch.testing.assert_close(got, want(inputs, rank))


def test_send_and_recv_move_a_tensor_between_ranks():
    sender = parse_ir("""graph s {
  symbol s0 in [2, 8]
  input %x: f32[s0, 4]
  %e: f32[s0, 4] = send(%x) {peer=1, tag=0}
  return %e
}
""")
    receiver = parse_ir("""graph r {
  symbol s0 in [2, 8]
  input %x: f32[s0, 4]
  %f: f32[s0, 4] = recv() {shape=[s0, 4], dtype=f32, peer=0, tag=0}
  return %f
}
""")
    x = torch.randn(3, 4)
    got = run_ranks(2, lambda r: run_graph([sender, receiver][r], {}, [x])[0])
    torch.testing.assert_close(got[1], x)


def test_collectives_outside_a_distributed_runtime():
    one = _collective_graph("all_reduce", axis="tp", ranks=[0])
    x = torch.randn(2, 4)
    torch.testing.assert_close(run_graph(one, {}, [x])[0], x)  # one rank: the identity
    two = _collective_graph("all_reduce", axis="tp", ranks=[0, 1])
    with pytest.raises(RuntimeError, match="dayzero run --nproc N"):
        run_graph(two, {}, [x])
