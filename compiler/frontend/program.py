"""An ExportedProgram as an IR Graph: its boundary (inputs, weights, outputs) and the node walk.

Parameters, buffers and lifted tensor constants become weights named by their state-dict FQN with
their tensors in `graph.weight_data`; user inputs keep the names torch derived from forward()'s
arguments; outputs are named by their place in the output pytree (`logits`, `out0`, `out1_x`).
"""

from __future__ import annotations

import re

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from compiler.errors import DayzeroError
from compiler.ir import Graph, TensorType, Value, verify

from .emitter import Unsupported, ir_dtype
from .fx_to_ir import FxConverter, conversion_error, unsupported_error
from .locations import Location, module_location
from .symbols import SymbolMap, UnsupportedSymbol

_INVALID = re.compile(r"[^A-Za-z0-9_]")


def program_to_graph(ep: ExportedProgram, model: torch.nn.Module) -> Graph:
    """Convert a (decomposed) ExportedProgram; raises one DayzeroError listing unsupported ops."""
    graph, converter = convert_program(ep, model)
    if converter.errors:
        raise conversion_error(converter.errors, converter.missing)
    if converter.missing:
        raise unsupported_error(converter.missing, type(model).__name__)
    graph.outputs = _outputs(ep, converter, graph)
    graph.remove_unused_weights()  # e.g. buffers only a training path reads
    verify(graph)
    return graph


def convert_program(ep: ExportedProgram, model: torch.nn.Module) -> tuple[Graph, FxConverter]:
    """Inputs, weights and every node that converts, without outputs; the ops that do not
    convert are collected in `converter.missing` (the partial export reports them all)."""
    graph = Graph(_INVALID.sub("_", type(model).__name__) or "main")
    symbols = SymbolMap()
    fallback = module_location(model)
    converter = FxConverter(graph, symbols, fallback)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    _declare_symbols(ep, placeholders, symbols)
    graph.symbols = symbols.ranges(ep.range_constraints)
    _add_inputs_and_weights(ep, placeholders, graph, symbols, converter.env, fallback)
    converter.run(ep.graph.nodes)
    return graph, converter


def _user_input_vals(ep: ExportedProgram, placeholders):
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            yield spec, placeholders[spec.arg.name].meta.get("val")


def _declare_symbols(ep, placeholders, symbols: SymbolMap) -> None:
    """Name size symbols s0, s1, ... in the order the user inputs' dims first use them."""
    for _, val in _user_input_vals(ep, placeholders):
        if isinstance(val, torch.Tensor):
            for dim in val.shape:
                if isinstance(dim, torch.SymInt):
                    for sym in sorted(dim.node.expr.free_symbols, key=str):
                        symbols.declare(sym)


def _tensor_type(val: torch.Tensor, symbols: SymbolMap, what: str) -> TensorType:
    try:
        return TensorType(ir_dtype(val.dtype), tuple(symbols.expr(d) for d in val.shape))
    except (Unsupported, UnsupportedSymbol) as exc:
        raise DayzeroError(f"{what}: {exc}", fix="pass tensors of a supported dtype "
                           "(see docs/ops.md) with static or input-derived sizes") from None


def _add_inputs_and_weights(ep, placeholders, graph: Graph, symbols: SymbolMap, env,
                            fallback: Location) -> None:
    for spec in ep.graph_signature.input_specs:
        node = placeholders[spec.arg.name]
        val = node.meta.get("val")
        if spec.kind == InputKind.USER_INPUT:
            env[node] = _user_input(graph, node.name, val, symbols)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            data = ep.state_dict.get(spec.target)
            if data is None:
                data = ep.constants[spec.target]
            data = data.detach()
            type_ = _tensor_type(data, symbols, f"weight {spec.target}")
            env[node] = graph.add_weight(spec.target, type_, data)
        else:
            raise DayzeroError(f"the model takes a {spec.kind.name.lower()} input "
                               f"({spec.target or node.name}) that dayzero cannot lower",
                               where=f"{fallback}", fix="use plain tensors, parameters and buffers")


def _user_input(graph: Graph, name: str, val, symbols: SymbolMap):
    if isinstance(val, torch.Tensor):
        return graph.add_input(_INVALID.sub("_", name), _tensor_type(val, symbols, f"input {name}"))
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise DayzeroError(f"input {name} is a dynamic Python scalar",
                           fix="pass it as a tensor, or leave it static (no Dim for it)")
    return val  # a Python constant torch.export specialized on


def output_names(ep: ExportedProgram) -> list[str]:
    """Names from the output pytree: dict keys / attributes, `out<i>` for positions."""
    spec = ep.call_spec.out_spec
    if spec is None:
        return []
    leaves = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    return [_path_name(path) for path, _ in pytree.tree_flatten_with_path(leaves)[0]]


def _path_name(path) -> str:
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    name = _INVALID.sub("_", "_".join(parts))
    if not name:
        return "out"
    return f"out{name}" if name[0].isdigit() else name


def _outputs(ep: ExportedProgram, converter: FxConverter, graph: Graph) -> list[Value]:
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    flat = list(out_node.args[0])
    specs = ep.graph_signature.output_specs
    for spec in specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise DayzeroError(f"the model updates {spec.target or spec.arg.name} in place "
                               f"({spec.kind.name.lower()})",
                               where=str(converter.last_loc),
                               fix="return the new value instead of mutating a buffer or input")
    names = output_names(ep)
    values: list[Value] = []
    for name, arg in zip(names, flat):
        value = converter.lookup(arg)
        if not isinstance(value, Value):
            raise DayzeroError(f"output {name} is not a tensor ({type(value).__name__})",
                               fix="return tensors only (or drop the non-tensor outputs)")
        if value.producer is not None and value not in values:
            value.name = graph.fresh_name(name)
        values.append(value)
    return values
