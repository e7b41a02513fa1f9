"""Checks IR invariants; the pass manager runs it after every pass.

Invariants: every op is known and gets the right operands and attributes; every value is defined
once, before its uses (nodes are in a topological order); no use refers to a value outside the
graph; declared result types equal what the op's shape rule gives; every size symbol is declared;
every value's use-list names exactly the operands that read it (a pass that changes `node.inputs`
or the node list behind the graph's back leaves them stale, and later rewrites would go wrong).
"""

from __future__ import annotations

from ..errors import VerificationError
from . import symbolic
from .graph import Graph, Node
from .ops import ShapeError, get_op
from .printer import format_node


def _fail(graph: Graph, node: Node | None, what: str, fix: str | None = None):
    where = None
    if node is not None:
        where = f"node `{format_node(node, graph)}`"
        if node.loc:
            where += f" from {node.loc}"
    raise VerificationError(what, where, fix)


def verify(graph: Graph) -> None:
    """Raise VerificationError at the first broken invariant."""
    defined: set[int] = set()
    names: set[str] = set()
    for name, bounds in graph.symbols.items():
        ok = isinstance(bounds, (tuple, list)) and len(bounds) == 2 and type(bounds[0]) is int and (
            bounds[1] is None or type(bounds[1]) is int)
        if not ok or bounds[0] < 0 or (bounds[1] is not None and bounds[1] < bounds[0]):
            _fail(graph, None, f"size symbol {name} has the range {bounds!r}",
                  "a range is (lo, hi) with 0 <= lo <= hi, or (lo, None) for no upper bound")

    def define(value, node):
        if id(value) in defined or value.name in names:
            _fail(graph, node, f"value %{value.name} is defined twice")
        if node is not None and value.producer is not node:
            _fail(graph, node, f"value %{value.name} does not point back at its producer")
        defined.add(id(value))
        names.add(value.name)
        _check_symbols(graph, node, value.type.shape)

    for value in graph.inputs:
        define(value, None)
    for name, value in graph.weights.items():
        if value.name != name:
            _fail(graph, None, f"weight table key {name} names value {value.name}")
        defined.add(id(value))
        _check_symbols(graph, None, value.type.shape)
    for node in graph.nodes:
        for value in node.inputs:
            if value is not None and id(value) not in defined:
                _fail(graph, node, f"operand {value.name} is not defined before this node",
                      "keep nodes in topological order and never read removed values")
        _check_node_types(graph, node)
        for value in node.outputs:
            define(value, node)
    for index, value in enumerate(graph.outputs):
        if value is None:
            _fail(graph, None, f"graph output {index} is missing (None)")
        if id(value) not in defined:
            _fail(graph, None, f"graph output {value.name} is not defined in the graph")
    _check_uses(graph)


_USE_FIX = "change operands and nodes through the Graph methods (set_input, replace_uses, " \
    "add_node, remove_nodes, set_nodes), never node.inputs or graph.nodes directly"


def _check_uses(graph: Graph) -> None:
    """Every operand is in its value's use-list, and every listed use is a live operand."""
    members = set(graph.nodes)
    for node in graph.nodes:
        for index, value in enumerate(node.inputs):
            if value is not None and (node, index) not in value._uses:
                _fail(graph, node, f"the use-list of %{value.name} misses operand {index} of "
                      "this node", _USE_FIX)
    for value in graph.values():
        for node, index in value._uses:
            if node not in members:
                _fail(graph, None, f"the use-list of %{value.name} names a node that is not in "
                      f"the graph ({node!r})", _USE_FIX)
            if index >= len(node.inputs) or node.inputs[index] is not value:
                _fail(graph, node, f"the use-list of %{value.name} names operand {index} of "
                      "this node, which reads something else", _USE_FIX)


def _check_symbols(graph: Graph, node, shape) -> None:
    for dim in shape:
        if not symbolic.is_size(dim):
            _fail(graph, node, f"dim {dim} is not a size (an integer >= 0 or an integer-valued "
                  "expression of size symbols)")
        missing = symbolic.free_symbols(dim) - set(graph.symbols)
        if missing:
            _fail(graph, node, f"size symbol(s) {sorted(missing)} are not declared in the graph")


def _check_node_types(graph: Graph, node: Node) -> None:
    try:
        opdef = get_op(node.op)
        opdef.check_arity(len(node.inputs))
        if opdef.complete_attrs(dict(node.attrs)) != node.attrs:
            _fail(graph, node, f"{node.op} attributes are incomplete", "fill in the defaults")
        inferred = opdef.infer([v.type if v is not None else None for v in node.inputs], node.attrs)
    except ShapeError as exc:
        _fail(graph, node, f"{node.op}: {exc}")
    except VerificationError:
        raise
    except Exception as exc:  # noqa: BLE001 - a shape rule that fails on odd operands
        _fail(graph, node, f"{node.op}: its shape rule fails on these operands and attributes "
              f"({type(exc).__name__}: {str(exc)[:200]})", f"see docs/ops.md for what {node.op} "
              "takes (an absent optional operand is None, not left out)")
    if len(inferred) != len(node.outputs):
        _fail(graph, node, f"{node.op} gives {len(inferred)} results, node has {len(node.outputs)}")
    for value, want in zip(node.outputs, inferred):
        got = value.type
        if got.dtype != want.dtype or got.rank != want.rank or not all(
                symbolic.equal(a, b) for a, b in zip(got.shape, want.shape)):
            _fail(graph, node, f"result %{value.name} has type {got}, but {node.op} gives {want}")
