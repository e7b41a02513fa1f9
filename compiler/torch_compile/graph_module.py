"""A graph dynamo hands over, as an nn.Module that torch.export can trace.

Dynamo (torch 2.5 and later, with inline_inbuilt_nn_modules) passes the module's parameters and
buffers as graph inputs beside the user's tensors, and each dynamic size as a SymInt input.
dayzero bakes weights into its artifact, as Torch-TensorRT does (constant folding, fusion and
weight packing need their values), so weight placeholders become attributes of the module;
SymInt placeholders become size reads of the user tensor they describe; user tensors stay
inputs, their dynamic dims declared to torch.export.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from compiler.errors import DayzeroError

# Dynamo's placeholder names for a module's own tensors: L_self_modules_fc_parameters_weight_
_WEIGHT_NAME = re.compile(r"_(parameters|buffers)_")


@dataclass
class Prepared:
    """What compile needs, and how to call the result with dynamo's arguments."""
    module: fx.GraphModule
    user_positions: list[int]       # dynamo's arguments the artifact takes, in order
    example_inputs: tuple[torch.Tensor, ...]
    dynamic_shapes: tuple[dict[int, Any] | None, ...]
    weights: list[torch.Tensor]


def is_weight(node: fx.Node, example: Any) -> bool:
    return isinstance(example, torch.nn.Parameter) or (
        isinstance(example, torch.Tensor) and bool(_WEIGHT_NAME.search(node.target)))


def prepare(gm: fx.GraphModule, example_inputs: list[Any]) -> Prepared:
    """The module of `gm` with weights baked in and SymInt inputs read from tensor shapes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise DayzeroError(f"dynamo passed {len(example_inputs)} inputs for "
                           f"{len(placeholders)} placeholders", "torch.compile graph",
                           "report this with the model: it is a dayzero bug")
    holder, graph, env = torch.nn.Module(), fx.Graph(), {}
    users, weights, sizes = [], [], []
    for i, (node, example) in enumerate(zip(placeholders, example_inputs)):
        if is_weight(node, example):
            name = f"weight_{len(weights)}"
            holder.register_buffer(name, example.detach())
            weights.append(example)
            env[node] = graph.get_attr(name)
        elif isinstance(example, torch.Tensor):
            env[node] = graph.placeholder(node.name)
            env[node].meta = dict(node.meta)
            users.append(i)
        elif isinstance(example, (torch.SymInt, int)):
            sizes.append(node)
        else:
            raise DayzeroError(f"input {node.target} is a {type(example).__name__}, not a tensor "
                               "or a size", "torch.compile graph",
                               "pass tensors (other Python values become constants in dynamo)")
    for node in sizes:
        env[node] = _size_of(graph, node, placeholders, env)
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    module = fx.GraphModule(holder, graph)
    # copies: torch.export must not touch the user's tensors (dynamo's guards on them would
    # then fail on the frame that created them)
    examples = tuple(example_inputs[i].detach().clone() for i in users)
    dynamic = tuple(dynamic_dims(_fake(placeholders[i])) for i in users)
    return Prepared(module, users, examples, dynamic, weights)


def _fake(node: fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _size_of(graph: fx.Graph, size: fx.Node, placeholders: list[fx.Node], env: dict) -> fx.Node:
    """`x.size(d)` for the first user tensor whose dim d is the SymInt `size` stands for."""
    symbol = _fake(size)
    expr = symbol.node.expr if isinstance(symbol, torch.SymInt) else None
    for node in placeholders:
        fake = _fake(node)
        if expr is None or not isinstance(fake, torch.Tensor) or env[node].op != "placeholder":
            continue
        for d, dim in enumerate(fake.shape):
            if isinstance(dim, torch.SymInt) and dim.node.expr == expr:
                return graph.call_function(torch.ops.aten.sym_size.int, (env[node], d))
    raise DayzeroError(f"the size input {size.target} is not the size of any tensor input",
                       "torch.compile graph",
                       "mark the tensor's dim dynamic (torch._dynamo.mark_dynamic) instead of "
                       "passing the size separately")


def dynamic_dims(fake: Any) -> dict[int, Any] | None:
    """{dim: Dim.AUTO} for each dim of a traced tensor that is symbolic; torch.export then keeps
    the relations between them that the graph implies."""
    if not isinstance(fake, torch.Tensor):
        return None
    dims = {d: torch.export.Dim.AUTO for d, s in enumerate(fake.shape)
            if isinstance(s, torch.SymInt)}
    return dims or None


def output_examples(gm: fx.GraphModule) -> list[Any]:
    """The example values of the graph's outputs, as dynamo recorded them."""
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    values = out.args[0]
    values = values if isinstance(values, (tuple, list)) else (values,)
    return [_fake(v) if isinstance(v, fx.Node) else v for v in values]
