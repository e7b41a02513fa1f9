"""fold_constants: compute at compile time what depends only on constants."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import sympy

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, TensorType, Value, get_op
from compiler.ir.weights import is_lazy

from .base import Pass, PassResult
from .registry import register_pass

# Ops never evaluated at compile time whatever their operands (their meaning needs the devices).
NEVER_FOLD_KINDS = frozenset({"collective"})
# a fold at least this large computed from one lazy (checkpoint) weight is computed when read
DEFER_BYTES = 1 << 12


def torch_tensor(data: Any) -> Any:
    """Weight data as a torch tensor (a lazy handle is read whole)."""
    import torch

    return data.load() if is_lazy(data) else torch.as_tensor(data)


def static_bytes(type: TensorType) -> int | None:
    """Storage size of a tensor type, or None when a dim is symbolic."""
    count = 1
    for dim in type.shape:
        if not isinstance(dim, int):
            return None
        count *= dim
    return count * type.dtype.itemsize


def is_static_attr(value: Any) -> bool:
    if isinstance(value, sympy.Basic):
        return False
    if isinstance(value, (list, tuple)):
        return all(is_static_attr(v) for v in value)
    return True


def foldable(node: Node) -> bool:
    """Whether the node itself allows evaluation: pure kind, static attributes and result types."""
    return (get_op(node.op).kind not in NEVER_FOLD_KINDS
            and all(is_static_attr(v) for v in node.attrs.values())
            and all(static_bytes(v.type) is not None for v in node.outputs))


@register_pass
@dataclass(frozen=True)
class FoldConstants(Pass):
    """Replace nodes whose operands are all constants by their precomputed results.

    Needs: a valid graph; constants are weights with data in `graph.weight_data` and the outputs
    of operand-less nodes with static attributes (`constant`, `full`, `arange`). Weights without
    data (a parsed graph) are not constants. Values are computed with each op's `reference`
    semantics (torch, imported when the pass runs), exactly what the reference backend computes.
    Growth rule: a value is computed at compile time only if it takes at most
    `always_fold_bytes`, or at most `max_growth` times the bytes of the weights it is computed
    from (creation nodes are computed from no weights); so expand/full/arange results that are
    large stay nodes, neither bloating the artifact nor the compiler's memory. The default 1.0
    also makes the pass idempotent (folded weights never license a bigger fold on a rerun).
    Guarantees: every node with operands that are all constants, and within the rule, is
    removed; a result still read by a remaining node or returned becomes a weight
    `folded.<value>` with its data in `graph.weight_data` (a 0-d result becomes a `constant`
    node keeping the value's name); types are unchanged. A result of at least DEFER_BYTES
    computed from one lazy weight (a streamed checkpoint's) is a lazy handle that computes it
    when read, so folding never reads a checkpoint: the writer does, a weight at a time.
    Weights and creation nodes left unused are left to eliminate_dead_code.
    Why: exports compute rotary tables, transposed weights, scale factors and masks from
    parameters at run time; folding them removes kernels from every forward call.
    """

    name: ClassVar[str] = "fold_constants"
    summary: ClassVar[str] = "precompute nodes whose operands are all constants"

    max_growth: float = 1.0
    always_fold_bytes: int = 1024

    def __post_init__(self):
        for option in ("max_growth", "always_fold_bytes"):
            if getattr(self, option) < 0:
                raise DayzeroError(f"option '{option}' of pass 'fold_constants' must be >= 0, "
                                   f"got {getattr(self, option)}", None,
                                   f"write e.g. fold_constants{{{option}=1}}")

    def run(self, graph: Graph) -> PassResult:
        origins = self._weight_origins(graph)
        folded = self._find_folds(graph, origins)
        if not folded:
            return PassResult(graph, False)
        removed = {id(n) for n in folded}
        wanted = _read_outside(graph, removed)
        deferred = _deferred(graph, folded, wanted, origins)
        values = _evaluate(graph, wanted - set(deferred))
        values.update(deferred)
        _rebuild(graph, removed, wanted, values)
        return PassResult(graph, True)

    @staticmethod
    def _weight_origins(graph: Graph) -> dict[int, frozenset[str]]:
        """Constant values -> names of the weights they are computed from (weights: themselves)."""
        return {id(v): frozenset([name]) for name, v in graph.weights.items()
                if name in graph.weight_data and static_bytes(v.type) is not None}

    def _find_folds(self, graph: Graph, origins: dict[int, frozenset[str]]) -> list[Node]:
        weight_bytes = {name: static_bytes(v.type) for name, v in graph.weights.items()}
        folded = []
        for node in graph.nodes:
            operands = [v for v in node.inputs if v is not None]
            if not foldable(node) or any(id(v) not in origins for v in operands):
                continue
            origin = frozenset().union(*(origins[id(v)] for v in operands))
            size = sum(static_bytes(v.type) for v in node.outputs)
            budget = self.max_growth * sum(weight_bytes[name] for name in origin)
            if size > max(self.always_fold_bytes, budget):
                continue
            if operands:  # operand-less creation nodes are constants, not folds
                folded.append(node)
            for value in node.outputs:
                origins[id(value)] = origin
        return folded


def _read_outside(graph: Graph, removed: set[int]) -> set[int]:
    """Outputs of removed nodes that a remaining node or the graph's return still reads."""
    produced = {id(v) for n in graph.nodes if id(n) in removed for v in n.outputs}
    read = {id(v) for n in graph.nodes if id(n) not in removed for v in n.inputs if v is not None}
    read |= {id(v) for v in graph.outputs}
    return produced & read


def _deferred(graph: Graph, folded: list[Node], wanted: set[int],
              origins: dict[int, frozenset[str]]) -> dict[int, Any]:
    """Lazy handles for the large folds computed from one lazy weight (a checkpoint's, not
    read yet), each computed when it is read: the writer streams them one at a time, so a
    model's transposed expert stacks are never all in memory at once."""
    lazy = {name for name, data in graph.weight_data.items() if is_lazy(data)}
    if not lazy:
        return {}
    producers = {id(v): n for n in folded for v in n.outputs}
    position = {id(n): i for i, n in enumerate(folded)}  # folded is in graph order
    handles = {}
    for node in folded:
        for value in node.outputs:
            sources = origins[id(value)]
            if id(value) not in wanted or len(sources & lazy) != 1 \
                    or static_bytes(value.type) < DEFER_BYTES:
                continue
            (name,) = sources & lazy
            plan = sorted(_producers_of(value, producers), key=lambda n: position[id(n)])
            known = {id(graph.weights[other]): torch_tensor(graph.weight_data[other])
                     for other in sources - lazy}
            replay = partial(_replay, plan, value, id(graph.weights[name]), known)
            handles[id(value)] = graph.weight_data[name].map_lazily(
                replay, tuple(value.type.shape), value.type.dtype)
    return handles


def _producers_of(value: Value, producers: dict[int, Node]) -> list[Node]:
    """The folded nodes `value` is computed by."""
    found, pending, seen = [], [value], set()
    while pending:
        node = producers.get(id(pending.pop()))
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node)
        pending.extend(v for v in node.inputs if v is not None)
    return found


def _replay(plan: list[Node], value: Value, source: int, known: dict[int, Any],
            tensor: Any) -> Any:
    """`value` computed by `plan` from the lazy weight's `tensor` (and in-memory weights)."""
    env = {**known, source: tensor}
    _run(plan, env)
    return env[id(value)].contiguous()


def _evaluate(graph: Graph, wanted: set[int]) -> dict[int, Any]:
    """Tensors of the wanted values, computing only the nodes they depend on."""

    needed = set(wanted)
    plan = []
    for node in reversed(graph.nodes):
        if any(id(v) in needed for v in node.outputs):
            plan.append(node)
            needed.update(id(v) for v in node.inputs if v is not None)
    tensors: dict[int, Any] = {id(v): torch_tensor(graph.weight_data[name])
                               for name, v in graph.weights.items() if id(v) in needed}
    _run(plan[::-1], tensors)
    return tensors


def _run(plan: list[Node], env: dict[int, Any]) -> None:
    """Evaluate `plan` (in order) with each op's reference, into `env` (value id -> tensor)."""
    import torch

    with torch.no_grad():
        for node in plan:
            args = [None if v is None else env[id(v)] for v in node.inputs]
            result = get_op(node.op).reference(*args, **node.attrs)
            results = result if isinstance(result, (tuple, list)) else (result,)
            for value, tensor in zip(node.outputs, results):
                env[id(value)] = _as_declared(node, value, tensor)


def _as_declared(node: Node, value: Value, tensor: Any) -> Any:
    """The reference result in the value's declared dtype; a shape mismatch is an op-table bug."""

    if list(tensor.shape) != list(value.type.shape):
        raise RuntimeError(f"{node.op} reference gave shape {list(tensor.shape)} for "
                           f"%{value.name}: {value.type}; the op table's shape rule disagrees")
    dtype = value.type.dtype.to_torch()
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _rebuild(graph: Graph, removed: set[int], wanted: set[int], tensors: dict[int, Any]) -> None:
    """Drop removed nodes; wanted 0-d results become constant nodes, the rest weights."""
    replace: dict[int, Value] = {}
    nodes = []
    for node in graph.nodes:
        if id(node) not in removed:
            for i, v in enumerate(node.inputs):
                if v is not None and id(v) in replace:
                    graph.set_input(node, i, replace[id(v)])
            nodes.append(node)
            continue
        for value in node.outputs:
            if id(value) not in wanted:
                continue
            tensor = tensors[id(value)]
            if value.type.rank == 0:
                attrs = get_op("constant").complete_attrs(
                    {"value": tensor.item(), "dtype": value.type.dtype})
                nodes.append(Node("constant", [], attrs, [value], node.loc))
            else:
                name = _fresh_weight_name(graph, f"folded.{value.name}")
                data = tensor if is_lazy(tensor) else tensor.contiguous().clone()
                replace[id(value)] = graph.add_weight(name, value.type, data)
    graph.nodes = nodes
    graph.outputs = [replace.get(id(v), v) for v in graph.outputs]


def _fresh_weight_name(graph: Graph, base: str) -> str:
    name, suffix = base, 1
    while name in graph.weights:
        name, suffix = f"{base}_{suffix}", suffix + 1
    return name
