"""Runs an IR graph op by op with each op's reference semantics (torch eager).

This is the golden model every other backend is checked against, so it does nothing clever:
bind size symbols from the input shapes, resolve symbolic attributes, call each op's `reference`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from compiler.errors import InputError
from compiler.ir import Graph, Node, get_op
from compiler.ir.symbolic import resolve


def bind_symbols(graph: Graph, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
    """Values of the size symbols, read from the inputs' bare-symbol dims."""
    bindings: dict[str, int] = {}
    for value, shape in zip(graph.inputs, shapes):
        for dim, size in zip(value.type.shape, shape):
            if isinstance(dim, sympy.Symbol):
                bindings.setdefault(dim.name, int(size))
    return bindings


def run_graph(graph: Graph, weights: Mapping[str, Any],
              inputs: Sequence[Any]) -> list[torch.Tensor]:
    """Evaluate `graph` on `inputs` (tensors or arrays) with `weights` (name -> tensor or array)."""
    env, bindings = bind_inputs(graph, weights, inputs)
    for node in graph.nodes:
        for value, tensor in zip(node.outputs, run_node(node, env, bindings)):
            env[id(value)] = tensor
    return [env[id(v)] for v in graph.outputs]


def bind_inputs(graph: Graph, weights: Mapping[str, Any],
                inputs: Sequence[Any]) -> tuple[dict[int, torch.Tensor], dict[str, int]]:
    """The starting environment (value id -> tensor for inputs and weights) and symbol values."""
    if len(inputs) != len(graph.inputs):
        raise InputError(f"expected {len(graph.inputs)} inputs, got {len(inputs)}")
    env: dict[int, torch.Tensor] = {}
    tensors = [torch.as_tensor(x) for x in inputs]
    for value, tensor in zip(graph.inputs, tensors):
        env[id(value)] = tensor
    for name, value in graph.weights.items():
        if name not in weights:
            raise InputError(f"no data for weight {name}")
        env[id(value)] = torch.as_tensor(weights[name])
    return env, bind_symbols(graph, [t.shape for t in tensors])


def run_node(node: Node, env: Mapping[int, torch.Tensor],
             bindings: Mapping[str, int]) -> tuple[torch.Tensor, ...]:
    """The results of one node, by its op's reference semantics, on operands held in `env`."""
    args = [None if v is None else env[id(v)] for v in node.inputs]
    attrs = {k: resolve(v, bindings) for k, v in node.attrs.items()}
    result = get_op(node.op).reference(*args, **attrs)
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)
