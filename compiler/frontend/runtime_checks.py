"""Drop the runtime checks that read tensor data, before conversion.

Models guard data-dependent invariants with `torch._check(tensor_condition)` (LLaVA checks that
the prompt holds as many image tokens as the image has features before its masked_scatter).
torch.export keeps such a guard as a chain `_is_all_true -> _local_scalar_dense -> sym_ite /
comparisons -> _assert_scalar` over an unbacked (data-dependent) symbol. The IR has no
assertions and its sizes are never data-dependent, so the whole chain goes, like the
`_assert_scalar` nodes on input sizes that the converters drop. Only chains whose every use ends
in an assertion are removed: a data-dependent scalar that feeds a computation stays, and the
converter reports it as unsupported.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import Node

_aten = torch.ops.aten
ASSERTIONS = frozenset({
    _aten._assert_scalar.default, _aten._assert_async.default, _aten._assert_async.msg,
    _aten.sym_constrain_range.default, _aten.sym_constrain_range_for_size.default,
})
# Where tensor data becomes a Python scalar (an unbacked symbol).
TO_SCALAR = frozenset({_aten._local_scalar_dense.default, _aten.item.default})


def drop_data_checks(program: ExportedProgram) -> list[str]:
    """Remove, in place, every data-to-scalar chain used only by assertions; returns the names
    of the removed assertion nodes (for logs and tests)."""
    graph = program.graph
    doomed: dict[Node, None] = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target in TO_SCALAR:
            chain = _only_checks(node)
            if chain is not None:
                doomed.update(dict.fromkeys(chain))
    if not doomed:
        return []
    removed = [n.name for n in doomed if n.target in ASSERTIONS]
    feeders = [arg for n in doomed for arg in n.all_input_nodes if arg not in doomed]
    for node in reversed(list(graph.nodes)):
        if node in doomed:
            graph.erase_node(node)
    _erase_dead(graph, feeders)
    program.graph_module.recompile()
    return removed


def _only_checks(start: Node) -> list[Node] | None:
    """`start` and everything downstream of it, if all of that ends in assertions."""
    seen: dict[Node, None] = {}
    pending = [start]
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen[node] = None
        if node.op != "call_function" or isinstance(node.meta.get("val"), torch.Tensor):
            return None  # feeds a tensor computation or the output: not a pure check
        if node.target not in ASSERTIONS:
            if not node.users:
                return None
            pending.extend(node.users)
    return list(seen)


def _erase_dead(graph, candidates: list[Node]) -> None:
    """What computed the checked condition (an eq, a sum), once nothing else reads it."""
    pending, erased = list(candidates), set()
    while pending:
        node = pending.pop()
        if node in erased or node.op != "call_function" or node.users or node.is_impure():
            continue
        inputs = list(node.all_input_nodes)
        graph.erase_node(node)
        erased.add(node)
        pending.extend(inputs)
