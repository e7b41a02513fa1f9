"""Writes a Graph as .dzir text; `parse_ir` reads it back to a graph that prints identically."""

from __future__ import annotations

import json
import re
from typing import Any

import sympy

from .dtypes import DType
from .graph import Graph, Node, Value

_PLAIN = re.compile(r"[A-Za-z0-9_.]+\Z")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # a graph name that needs no quotes


def _ref(sigil: str, name: str) -> str:
    return sigil + (name if _PLAIN.match(name) else json.dumps(name))


def value_ref(graph: Graph | None, value: Value | None) -> str:
    if value is None:
        return "_"
    if graph is not None and graph.is_weight(value):
        return _ref("@", value.name)
    return _ref("%", value.name)


def format_attr(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, DType):
        return value.value
    if isinstance(value, (int, sympy.Basic)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    raise TypeError(f"attribute value {value!r} of type {type(value).__name__} has no text form")


def format_node(node: Node, graph: Graph | None = None) -> str:
    results = ", ".join(f"{value_ref(graph, v)}: {v.type}" for v in node.outputs)
    args = ", ".join(value_ref(graph, v) for v in node.inputs)
    text = f"{results} = {node.op}({args})"
    if node.attrs:
        text += " {" + ", ".join(f"{k}={format_attr(v)}" for k, v in node.attrs.items()) + "}"
    if node.loc is not None:
        text += f" loc({json.dumps(node.loc)})"
    return text


def print_ir(graph: Graph) -> str:
    title = graph.name if _NAME.match(graph.name) else json.dumps(graph.name)
    lines = [f"graph {title} {{"]
    for name, (lo, hi) in graph.symbols.items():
        lines.append(f"  symbol {name} in [{lo}, {'inf' if hi is None else hi}]")
    for value in graph.inputs:
        lines.append(f"  input {value_ref(graph, value)}: {value.type}")
    for value in graph.weights.values():
        lines.append(f"  weight {value_ref(graph, value)}: {value.type}")
    for node in graph.nodes:
        lines.append("  " + format_node(node, graph))
    lines.append("  return " + ", ".join(value_ref(graph, v) for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"
